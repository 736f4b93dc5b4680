"""How graded tests reach a learner's code: always in a child process, never in the test's own (notebook 00).

A test asks for a learner's function to be run, in one child process or in several ranks,
with a time limit; what comes back is plain data (tensors, numbers, strings, lists, dicts)
that the test compares with a reference it computed itself. A learner's infinite loop, crash
or `sys.exit` fails that one test with a clear message; it cannot touch the test process or
its verdict.

The folder graded is `$COURSE_TARGET` (the pytest plugin sets it from `--target`).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import linecache
import os
import sys
import time
import weakref
from pathlib import Path
from typing import Any, Callable

import cloudpickle

from course_lib import paths
from course_lib.dist.launcher import LaunchTimeout, RankFailed, RankJob
from course_lib.dist.warm import GRADED, ranks_kept, run_kept
from course_lib.grading import ONE_CORE_PER_RANK, loops, time_rule
from course_lib.grading.fork_server import register_preloads
from course_lib.grading.results import unwritten_message

__all__ = ["run", "call", "ExerciseFailed", "ExerciseStopped", "exercise_path", "load_exercise_file",
           "exception_raised_by", "confine_learner_code", "warm_up_confined_ranks",
           "stub_hints", "STUB_HINTS"]

# Every exercise's stub hints, {"ex05": [hint, ...]}: the text of each `raise NotImplementedError(hint)` that
# `python3 course.py exercises` writes into the stubs (course_lib/instructor/exercises.py writes this file too).
STUB_HINTS = Path(__file__).with_name("stub_hints.json")

register_preloads()  # what the graded tests' ranks import, in the fork server (course_lib.grading.fork_server)

_confinement = None  # the grader's Confinement, set once by the pytest plugin (--confine); None for learners
_memory_guard = None  # the judge's view of that student's memory limit (grading.memory_guard), if it has one


class ExerciseFailed(AssertionError):
    """The learner's code raised, hung, exited or returned something unusable (notebook 00)."""


class ExerciseStopped(BaseException):
    """The learner's code is not written yet, or ran out of its time or memory: the test fails at once (issue 20).

    A BaseException, not an Exception, so that Hypothesis does not catch it to try other inputs and shrink them:
    every input fails a stub the same way, and each try of a hanging function costs its whole time limit (a
    test that drew 10 inputs spent over 30 s shrinking a stub's failure). pytest reports it as a failure.
    """


def confine_learner_code(confinement) -> None:
    """Every later run() confines its child processes this way (the grader's judge calls it once)."""
    global _confinement, _memory_guard
    from course_lib.grading.memory_guard import MemoryGuard

    _confinement = confinement
    _memory_guard = MemoryGuard.for_confinement(confinement) if confinement is not None else None


def _nothing(rank: int, world_size: int) -> None:
    return None


def warm_up_confined_ranks(folder: str | os.PathLike) -> None:
    """Start the confined fork server and two gloo ranks, kept for the graded tests of `folder`'s exercises
    (course_lib.dist.warm), then the memory guard (check, the grader's judge).

    Before the first test, so that no test's time limit pays for the fork server's import of torch or a
    first process group (seconds on a busy machine), and a sandbox that cannot start shows at once. (Starting a
    group of 3 beside it made check("ex08") no faster: 10.7-10.8 s against 10.2-10.6 s.)
    """
    with ranks_kept(GRADED):
        run_kept(_graded_job(_nothing, (), str(folder), 2, 600.0))
    if _memory_guard is not None:
        _memory_guard.start()


def exercise_path(exercise: str, folder: str | os.PathLike | None = None) -> Path:
    """The file that holds `exercise` (e.g. 'ex01') in `folder`, by default the folder being graded (notebook 00)."""
    folder = Path(folder or os.environ.get("COURSE_TARGET") or paths.EXERCISES)
    matches = sorted(folder.glob(f"{exercise}_*.py")) or sorted(folder.glob(f"{exercise}.py"))
    if not matches:
        raise ExerciseFailed(f"no file for {exercise} in {folder} (expected {exercise}_<topic>.py)")
    return matches[0]


# The code each exercise file compiled to, by path, with the text it came from: a kept rank runs the same file again
# and again, and nothing caches it (no __pycache__ is written where PYTHONDONTWRITEBYTECODE is set, as in the
# judges): 2-3 ms a run for a solution file, in each rank.
_compiled: dict[str, tuple[bytes, Any]] = {}


def load_exercise_file(path: str | os.PathLike):
    """Import the exercise file at `path` afresh (its latest text), under its own name (notebook 00)."""
    path = str(path)
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # so the learner's file may import its neighbours
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    source = spec.loader.get_data(path)
    text, code = _compiled.get(path, (None, None))
    if text != source:
        code = spec.loader.source_to_code(source, path)  # what exec_module would compile
        _compiled[path] = (source, code)
    exec(code, module.__dict__)  # noqa: S102 - the learner's file, as importing it does
    return module


def exception_raised_by(function: Callable[..., Any], *args: Any, **kwargs: Any) -> list[str]:
    """[the exception's class name, its message] that `function(*args)` raised, or ["returned", ""] (notebook 00).

    For tests of "bad input gets a clear error"; it runs in the child, next to the learner's code.
    NotImplementedError is raised again, never an answer: an untouched stub then reads as "not implemented yet"
    (see `run`), and any other NotImplementedError fails the test with its traceback.
    """
    try:
        function(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - any exception is an answer to record
        return [type(exc).__name__, str(exc)]
    return ["returned", ""]


@functools.lru_cache(maxsize=None)
def _all_stub_hints(path: str) -> dict[str, tuple[str, ...]]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return {exercise: tuple(hints) for exercise, hints in data.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def stub_hints(exercise: str) -> tuple[str, ...] | None:
    """The hints of `exercise`'s untouched stubs (STUB_HINTS), or None where they are not known."""
    return _all_stub_hints(str(STUB_HINTS)).get(exercise)


class StubReached(Exception):
    """(in the child) An untouched stub raised its NotImplementedError; the message is JSON: function and hint."""


def _is_a_stubs_raise(filename: str, line: int, message: str) -> bool:
    """Whether the statement at `line` of `filename` is `raise NotImplementedError(<message as a literal>)` as a
    stub has it: a statement of its function's own body (a stub may set things up before it), in no `if` or loop."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for statement in node.body:
            if isinstance(statement, ast.Raise) and statement.lineno == line:
                call = statement.exc
                return (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                        and call.func.id == "NotImplementedError" and not call.keywords and len(call.args) == 1
                        and isinstance(call.args[0], ast.Constant) and call.args[0].value == message)
    return False


def stub_function(error: BaseException, path: str, hints: tuple[str, ...] | None) -> str | None:
    """The function (its qualified name) whose untouched stub raised `error`, or None if `error` is anything else.

    A stub's NotImplementedError is raised in the learner's file itself (not in torch or a library, which raise
    NotImplementedError for an operation they lack), with one of the stub hints of the exercise as its message
    (not a learner's own NotImplementedError in a half-written function). Where the hints are not known (an
    exercise missing from stub_hints.json), the stub's shape tells: `raise NotImplementedError('...')` with that
    very message, a statement of its function's own body (in no `if` or loop).
    """
    if type(error) is not NotImplementedError or len(error.args) != 1 or not isinstance(error.args[0], str):
        return None
    last = error.__traceback__
    while last is not None and last.tb_next is not None:
        last = last.tb_next
    if last is None:
        return None
    code = last.tb_frame.f_code
    try:
        if not os.path.samefile(code.co_filename, path):
            return None
    except OSError:
        return None
    message = error.args[0]
    if hints is not None and message not in hints:
        return None
    if hints is None and not _is_a_stubs_raise(code.co_filename, last.tb_lineno, message):
        return None
    return getattr(code, "co_qualname", code.co_name)


class LoopReached(Exception):
    """(in the child) A function that ran out of time in an earlier test was called again (loops.LoopedEarlier)."""


def _in_child(rank: int, world_size: int, path: str, driver: bytes, args: tuple, ranks: bool,
              hints: tuple[str, ...] | None = None, looped: tuple = ()) -> Any:
    driver = cloudpickle.loads(driver)
    module = load_exercise_file(path)
    if looped:
        loops.disable_looped(module, list(looped))
    try:
        if ranks:
            return driver(rank, world_size, module, *args)
        return driver(module, *args)
    except NotImplementedError as error:
        function = stub_function(error, path, hints)
        if function is None:
            raise
        raise StubReached(json.dumps({"function": function, "hint": error.args[0]})) from None
    except loops.LoopedEarlier as error:
        raise LoopReached(str(error)) from None


def _call_function(module, function: str, *args):
    return getattr(module, function)(*args)


def _explain(exercise: str, error: Exception) -> ExerciseFailed | ExerciseStopped:
    if isinstance(error, LaunchTimeout):  # its first line is the summary, the rest says why that usually happens
        summary, _, why = str(error).partition("\n")
        return ExerciseStopped(f"{exercise}: did not finish in time and was stopped ({summary.rstrip('.')})"
                              + (f"\n{why}" if why else ""))
    detail = error.detail if isinstance(error, RankFailed) else str(error)
    lines = [line for line in detail.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "failed"
    stub, _, found = last.partition(": ")
    if stub == f"{StubReached.__module__}.{StubReached.__qualname__}":
        try:
            found = json.loads(found)
            return ExerciseStopped(unwritten_message(exercise, found["function"], found["hint"]))
        except (ValueError, KeyError, TypeError):
            pass
    if stub == f"{LoopReached.__module__}.{LoopReached.__qualname__}":
        return ExerciseStopped(f"{exercise}: {found}")
    ranks = isinstance(error, RankFailed) and error.world_size > 1
    where = f" in rank {error.rank} of {error.world_size}" if ranks else ""
    return ExerciseFailed(f"{exercise}{where}: {last}\n\n{detail.rstrip()}")


# Each driver pickled once (cloudpickle, by value): pickling a function looks through all of sys.modules for each module
# it uses (cloudpickle's _find_imported_submodules), 5 ms a run with torch loaded, 2-3 s of a judge's 557 runs. The
# pickle holds the globals the driver reads as they were then: no graded test rebinds one (no `global` statement).
_driver_pickles: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _pickled(driver: Callable[..., Any]) -> bytes:
    try:
        return _driver_pickles[driver]
    except (KeyError, TypeError):  # TypeError: not weakly referable (a builtin): pickled each time
        data = cloudpickle.dumps(driver)
    try:
        _driver_pickles[driver] = data
    except TypeError:
        pass
    return data


def _graded_job(fn: Callable[..., Any], args: tuple, folder: str, world_size: int | None, timeout: float) -> RankJob:
    """A graded run of `fn` (in `world_size` gloo ranks, or one child process without a group where None) for the
    exercises in `folder`: runs of one world size share kept ranks (course_lib.dist.warm), the warm-up's too."""
    ranks = world_size is not None
    return RankJob(fn, world_size if ranks else 1, args, backend="gloo", init_process_group=ranks, timeout=timeout,
                   quiet=True, prefix_output=ranks, plain_results=True, env={"COURSE_TARGET": folder},
                   confinement=_confinement, dump_stacks_after=_stacks_after(timeout), yield_gloo_network_thread=True,
                   one_core_per_rank=os.environ.get(ONE_CORE_PER_RANK) == "1")


def run(exercise: str, driver: Callable[..., Any], *args: Any, world_size: int | None = None,
        timeout: float = 60.0, target: str | os.PathLike | None = None) -> Any:
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
    ranks = world_size is not None
    looped = tuple((loop.function, loop.test) for loop in loops.loops_of(exercise) if loop.function)
    job = _graded_job(_in_child, (path, _pickled(driver), args, ranks, stub_hints(exercise), looped),
                      os.path.dirname(path), world_size, timeout)
    kills = _memory_guard.kills() if _memory_guard is not None else 0
    try:
        results = run_kept(job)  # the ranks of this test's previous run, where the plugin keeps them
    except (RankFailed, LaunchTimeout) as error:
        if _memory_guard is not None and _memory_guard.kills() > kills:  # a rank was stopped for memory
            raise ExerciseStopped(f"{exercise}: {_memory_guard.message()}") from None
        explained = _explain(exercise, error)
        if isinstance(error, LaunchTimeout):
            said = str(explained).removeprefix(f"{exercise}: ")
            raise ExerciseStopped(f"{exercise}: {_note_loop(exercise, path, job)}{said}") from None
        raise explained from None
    except BaseException as error:  # noqa: BLE001 - the test's own time limit (pytest-timeout) raised in the wait
        if not time_rule.TIMED_OUT.match(str(error)):
            raise
        raise ExerciseStopped(f"{exercise}: {_note_loop(exercise, path, job)}{error}") from None
    return results if ranks else results[0]



def _stacks_after(timeout: float) -> float:
    """When a rank still running writes its stack: just before the test's deadline, or the launch's timeout."""
    end = loops.deadline()
    left = timeout if end is None else min(timeout, end - time.monotonic())
    return max(0.05, left - loops.DUMP_MARGIN)


def _note_loop(exercise: str, path: str, job: RankJob) -> str:
    """Record where the stopped ranks were (grading.loops); the start of the test's message that says so."""
    found = ("", 0)
    for rank in sorted(job.stacks):
        found = loops.looping_function(job.stacks[rank], path)
        if found[0]:
            break
    loop = loops.note(exercise, *found)
    return f"{loop.where()} was still running when time ran out; " if loop.function else ""



def call(exercise: str, function: str, *args: Any, timeout: float = 60.0) -> Any:
    """Call the learner's `function(*args)` from `exercise` in a child process; return plain data (notebook 00)."""
    return run(exercise, _call_function, function, *args, timeout=timeout)
