"""How graded tests reach a learner's code: always in a child process, never in the test's own (notebook 00).

A test asks for a learner's function to be run, in one child process or in
several ranks, with a time limit; what comes back is plain data (tensors,
numbers, strings, lists, dicts) that the test compares with a reference it
computed itself. A learner's infinite loop, crash or `sys.exit` fails that one
test with a clear message; it cannot touch the test process or its verdict.

The folder graded is `$COURSE_TARGET` (tests/conftest.py sets it from `--target`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import cloudpickle

from course_lib.dist import LaunchTimeout, RankFailed, _run_ranks

__all__ = ["call", "run", "ExerciseFailed", "exercise_path"]


class ExerciseFailed(AssertionError):
    """The learner's code raised, hung, exited or returned something unusable (notebook 00)."""


def exercise_path(exercise: str, target: str | os.PathLike | None = None) -> Path:
    """The file that holds `exercise` (e.g. 'ex01') in the graded folder (notebook 00)."""
    folder = Path(target or os.environ.get("COURSE_TARGET") or Path(__file__).resolve().parent.parent / "exercises")
    matches = sorted(folder.glob(f"{exercise}_*.py")) or sorted(folder.glob(f"{exercise}.py"))
    if not matches:
        raise ExerciseFailed(f"no file for {exercise} in {folder} (expected {exercise}_<topic>.py)")
    return matches[0]


def _load_module(path: str):
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # so the learner's file may import its neighbours
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _in_child(rank: int, world_size: int, path: str, driver: Callable, args: tuple, ranks: bool) -> Any:
    module = _load_module(path)
    if ranks:
        return driver(rank, world_size, module, *args)
    return driver(module, *args)


def _call_function(module, function: str, *args):
    return getattr(module, function)(*args)


def _explain(exercise: str, error: Exception) -> ExerciseFailed:
    if isinstance(error, LaunchTimeout):
        return ExerciseFailed(f"{exercise}: did not finish in time and was stopped ({error})")
    detail = error.detail if isinstance(error, RankFailed) else str(error)
    lines = [line for line in detail.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "failed"
    if last.startswith("NotImplementedError"):
        hint = last.partition(":")[2].strip()
        return ExerciseFailed(f"{exercise}: not implemented yet" + (f" (hint: {hint})" if hint else ""))
    where = f" in rank {error.rank} of {error.world_size}" if isinstance(error, RankFailed) and error.world_size > 1 else ""
    return ExerciseFailed(f"{exercise}{where}: {last}\n\n{detail.rstrip()}")


def run(
    exercise: str,
    driver: Callable[..., Any],
    *args: Any,
    world_size: int | None = None,
    timeout: float = 60.0,
    target: str | os.PathLike | None = None,
) -> Any:
    """Run `driver(module, *args)` in a child process, where `module` is the learner's exercise file (notebook 00).

    With `world_size`, run `driver(rank, world_size, module, *args)` in that many gloo ranks
    with a process group, and return the list of their results. `driver` is test code:
    it calls the learner's functions and returns plain data for the test to check.
    """
    path = str(exercise_path(exercise, target))
    # Test modules are not importable in the child: send the driver's code along by value.
    module = sys.modules.get(getattr(driver, "__module__", ""), None)
    if module is not None and not module.__name__.startswith(("course_lib", "torch", "builtins")):
        cloudpickle.register_pickle_by_value(module)
    limits = json.loads(os.environ["COURSE_LIMITS"]) if os.environ.get("COURSE_LIMITS") else None
    ranks = world_size is not None
    try:
        results = _run_ranks(
            _in_child,
            world_size if ranks else 1,
            (path, driver, args, ranks),
            backend="gloo",
            init_process_group=ranks,
            timeout=timeout,
            quiet=True,
            prefix_output=ranks,
            plain_results=True,
            limits=limits,
            env={"COURSE_TARGET": os.path.dirname(path)},
        )
    except (RankFailed, LaunchTimeout) as error:
        raise _explain(exercise, error) from None
    return results if ranks else results[0]


def call(exercise: str, function: str, *args: Any, timeout: float = 60.0) -> Any:
    """Call the learner's `function(*args)` from `exercise` in a child process; return plain data (notebook 00)."""
    return run(exercise, _call_function, function, *args, timeout=timeout)
