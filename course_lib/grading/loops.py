"""A function that ran out of time costs its own tests, not the student's grade (the grader's judge and `check`).

When a test stops at its time limit, the rank that was still running wrote its stack shortly before (the
launcher's `dump_stacks_after`); the innermost frame in the learner's file names the function that looped.
From then on, in this pytest process:

- that function raises `LoopedEarlier` at once in every later child (the test fails in a tenth of a second,
  saying which earlier test it looped in), instead of looping again to each test's limit;
- the exercise's other tests run with the limit `time_rule` gives tests after a loop (the reference's time
  times the factor, at least LOOPED_FLOOR rather than FLOOR): a function that also loops costs less;
- after STOP_AFTER tests of an exercise ran out of time, its remaining tests are not run (they fail at once,
  saying why), so that an exercise whose every function loops costs two tests' limits, not one per test.

Other exercises are untouched: they keep their limits and their points.
"""

from __future__ import annotations

import ast
import re
import time
from dataclasses import dataclass

__all__ = ["Loop", "LoopedEarlier", "STOP_AFTER", "reset", "start_test", "deadline", "note", "loops_of", "stopped_message",
           "looping_function", "disable_looped", "summary"]

STOP_AFTER = 2  # tests of one exercise that ran out of time before its remaining tests are not run
DUMP_MARGIN = 0.3  # seconds before the test's deadline at which a still-running rank writes its stack


@dataclass(frozen=True)
class Loop:
    """One test that ran out of time: its exercise, the learner's function it was in (if known), and the test."""

    exercise: str
    function: str  # qualified name in the learner's file ('MiniDDP.step'), or '' where no frame was there
    line: int
    test: str  # the test's nodeid

    def where(self) -> str:
        return f"{self.function} (line {self.line})" if self.function else "code outside the learner's functions"


class LoopedEarlier(BaseException):
    """(in the child) A learner's function that ran out of time in an earlier test was called again.

    A BaseException, so that the learner's own `except Exception` cannot swallow it and loop on."""


_current: dict = {"test": "", "deadline": None}
_loops: dict[str, list[Loop]] = {}


def reset() -> None:
    """Forget every loop: each pytest session starts afresh (the wrong-answer and mutant workers run many in one
    process, and a loop of one graded file must not fail the next file's tests)."""
    _loops.clear()
    _current.update(test="", deadline=None)


def start_test(nodeid: str, limit: float | None) -> None:
    """The plugin, as each test starts: its nodeid and, where it has a time limit, its deadline."""
    _current["test"] = nodeid
    _current["deadline"] = time.monotonic() + limit if limit else None


def deadline() -> float | None:
    """When the running test's time limit ends (time.monotonic()), or None without a limit."""
    return _current["deadline"]


def loops_of(exercise: str) -> list[Loop]:
    return list(_loops.get(exercise, ()))


def note(exercise: str, function: str, line: int) -> Loop:
    """Record that the running test of `exercise` ran out of time in `function` (may be '')."""
    loop = Loop(exercise, function, line, _current["test"])
    _loops.setdefault(exercise, []).append(loop)
    return loop


def stopped_message(exercise: str) -> str | None:
    """Why a test of `exercise` is not run (its exercise looped STOP_AFTER times), or None to run it."""
    loops = _loops.get(exercise, [])
    if len(loops) < STOP_AFTER:
        return None
    where = "; ".join(f"{loop.where()} in {loop.test.split('::')[-1]}" for loop in loops)
    return (f"{exercise}: not run, because {len(loops)} of this exercise's tests ran out of time ({where}); "
            "its other tests are not run so that the other exercises are graded in time")


def summary() -> dict[str, list[str]]:
    """{exercise: [function or '?', ...]} of every loop so far (for the report)."""
    return {exercise: [loop.function or "?" for loop in loops] for exercise, loops in _loops.items()}


# The lines faulthandler writes: '  File "/path/ex05_ddp.py", line 12 in bucket_assignment'
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)')


def looping_function(stack: str, path: str) -> tuple[str, int]:
    """(qualified name, line) of the innermost frame of `path` in a faulthandler dump, or ('', 0).

    faulthandler names a frame by its code's name only; the qualified name (a method's class, the top-level
    function around a nested one) comes from the file's syntax tree.
    """
    for line in stack.splitlines():  # most recent call first
        match = _FRAME.match(line)
        if match and match.group("file") == path:
            number = int(match.group("line"))
            return _enclosing_definition(path, number) or match.group("name"), number
    return "", 0


def _enclosing_definition(path: str, line: int) -> str:
    """The module-level function, or method of a module-level class, whose body holds `line` ('' if none)."""
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return ""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= node.end_lineno:
            return node.name
        if isinstance(node, ast.ClassDef) and node.lineno <= line <= node.end_lineno:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.lineno <= line <= item.end_lineno:
                    return f"{node.name}.{item.name}"
    return ""


def disable_looped(module, loops: list[tuple[str, str]]) -> None:
    """(in the child) Make each (function, test) of `loops` raise LoopedEarlier when called, in `module`."""
    import inspect

    for qualname, test in loops:
        owner, _, name = qualname.rpartition(".")
        holder = module
        for part in owner.split(".") if owner else ():
            holder = getattr(holder, part, None)
        original = inspect.getattr_static(holder, name, None) if holder is not None else None
        if original is None or isinstance(original, property):
            continue

        def stopped(*args, _name=qualname, _test=test, **kwargs):
            raise LoopedEarlier(f"{_name} ran out of time in {_test.split('::')[-1]}, so it is not run again")

        if isinstance(original, staticmethod):
            stopped = staticmethod(stopped)
        elif isinstance(original, classmethod):
            stopped = classmethod(stopped)
        setattr(holder, name, stopped)
