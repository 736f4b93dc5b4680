"""Checks graded tests make in the parent on what a learner's code gave back, shared by several exercises (04-08).

    from course_lib.grading.audits import assert_rejects

    got = run("ex07", _bad_driver, calls)            # [(exception class name or None, message), ...]
    for ((p, m), broken), (raised, message) in zip(cases, got):
        assert_rejects(f"bubble_fraction({p!r}, {m!r})", raised, message, broken)

Each one asserts as the test's own asserts do (pytest rewrites this module's asserts too, see __init__.py), so a
failure explains itself the same way wherever the check is written.
"""

from __future__ import annotations

__all__ = ["assert_rejects"]


def assert_rejects(where: str, raised: str | None, message: str, broken: str, say_what: bool = True) -> None:
    """A call with one bad argument (`broken`, its name) raised ValueError, and the message names that argument
    (and, with `say_what`, is asked to say what to pass)."""
    assert raised == "ValueError", f"{where} must raise ValueError, not {raised} {message}".rstrip()
    assert broken in message, (
        f"{where}: the ValueError should name the argument to fix ({broken})"
        f"{' and say what to pass' if say_what else ''}; it says {message!r}")
