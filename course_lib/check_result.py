"""The outcome of `check`: one row per test, its points, and what to show of each message (notebook 00).

A test that passed but took longer than the grader allows is "too slow" and earns nothing (its limit comes from
check's TimeRule, course_lib/check.py); the tests that stopped at the same untouched stub share one message, that
stub's hint (grading.results.unwritten). The two displays of a result are in course_lib/check_display.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from course_lib.check_display import html_table, text_table
from course_lib.check_failures import learner_traceback, smallest_failing_input
from course_lib.grading import time_rule
from course_lib.grading.results import TestOutcome, unwritten
from course_lib.tables import plural

if TYPE_CHECKING:
    from course_lib.check import TimeRule

__all__ = ["CheckResult"]

_TIMEOUT = time_rule.TIMED_OUT


@dataclass
class CheckResult:
    """The outcome of `check`: one row per test, and the points (notebook 00)."""

    exercise: str
    tests: list[TestOutcome] = field(default_factory=list)
    output: str = ""
    rule: TimeRule | None = None  # the grader's time limits, where known
    target: Path | None = None  # the folder graded: frames of files in it are the learner's own

    def too_slow(self, test: TestOutcome) -> bool:
        """Passed here, but took longer than the grader allows: it earns nothing when graded, nor here."""
        limit = self.rule.grader_limit(test.nodeid) if self.rule is not None else None
        return test.graded and test.outcome == "passed" and limit is not None and test.duration > limit

    @property
    def earned(self) -> float:
        return sum(t.earned for t in self.tests if not self.too_slow(t))

    @property
    def possible(self) -> float:
        return sum(t.possible for t in self.tests)

    @property
    def all_passed(self) -> bool:
        return bool(self.tests) and all((t.outcome == "passed" and not self.too_slow(t)) or not t.graded
                                        for t in self.tests)

    def _status(self, test: TestOutcome) -> str:
        return "too slow" if self.too_slow(test) else test.status

    def message(self, test: TestOutcome) -> str:
        """The test's whole message, as the tables show it: a too slow pass or a stop at the time limit explained."""
        limit = self.rule.grader_limit(test.nodeid) if self.rule is not None else None
        if self.too_slow(test):
            return (f"passed in {test.duration:.1f} s; the grader allows about {limit:g} s: make it faster or it "
                    f"will lose its {plural(test.points, 'point', spec='g')}")
        stub = unwritten(test)
        if stub is not None:  # its first line says it all: every input fails a stub the same way
            return stub.message.removeprefix(f"{self.exercise}: ")
        text = (test.not_graded or test.message).removeprefix(f"{self.exercise}: ")  # the table says which
        if test.outcome == "failed" and _TIMEOUT.search(_first_line(text)) and self.rule is not None:
            allowed = f"the grader allows about {limit:g} s" if limit is not None else "no reference time is known"
            return (f"stopped after {self.rule.stop_after(test.nodeid):g} s ({allowed}): a loop that never ends, "
                    f"or code much slower than the reference solution")
        return text

    def rows(self, verbose: bool = False) -> list[tuple[str, str, str, str]]:
        """(test, result, points, message: its first line, or all of it if verbose); the cases of a parametrized
        test that all end the same way share one row, e.g. `test_ring [2, 3, 4]`, so a hint is not repeated. A test
        that stopped at an untouched stub has one message, whatever its inputs: 'f is not implemented yet (hint: ...)'
        (grading.results.unwritten, the grouping the grader's feedback uses too)."""
        groups: dict[tuple, list[TestOutcome]] = {}
        for t in self.tests:
            function, _, case = t.nodeid.split("::", 1)[-1].partition("[")
            message = self.message(t).strip() if verbose else _first_line(self.message(t))
            groups.setdefault((function, self._status(t), message), []).append(t)
        rows = []
        for (function, status, message), tests in groups.items():
            cases = [t.nodeid.partition("[")[2].rstrip("]") for t in tests]
            name = function + (f" [{', '.join(cases)}]" if any(cases) else "")
            mark = {"passed": "passed", "failed": "FAILED"}.get(status, status)
            earned = sum(t.earned for t in tests if not self.too_slow(t))
            points = "–" if status == "not graded" else f"{earned:g} / {sum(t.possible for t in tests):g}"
            rows.append((name, mark, points, message))
        return rows

    def summary(self) -> str:
        text = f"{self.exercise}: {self.earned:g} / {self.possible:g} points"
        slow = [t for t in self.tests if self.too_slow(t)]
        stopped = [t for t in self.tests if t.outcome == "failed" and _TIMEOUT.search(_first_line(t.message))]
        if (slow or stopped) and self.rule is not None:
            text += f"; {self.rule.note()}"
        return text

    def smallest_failing_inputs(self) -> list[tuple[str, str]]:
        """(test, input) for each failed test whose inputs Hypothesis drew: the smallest input it found that fails."""
        found = []
        for t in self.tests:
            stub = unwritten(t) is not None  # every input fails a stub: nothing to learn from one
            shown = smallest_failing_input(t.message) if t.outcome == "failed" and not stub else ""
            if shown:
                found.append((t.nodeid.split("::", 1)[-1], shown))
        return found

    def where_it_failed(self) -> list[tuple[list[str], str]]:
        """([tests], traceback) for each different error raised in the learner's own files: their frames only (file,
        line, code), and the exception; tests that failed the same way share one entry."""
        found: dict[str, list[str]] = {}
        for t in self.tests:
            shown = (learner_traceback(t.message, self.target) if t.outcome == "failed" and unwritten(t) is None
                     else "")
            name = t.nodeid.split("::", 1)[-1].partition("[")[0]
            if shown and name not in found.setdefault(shown, []):
                found[shown].append(name)
        return [(names, shown) for shown, names in found.items()]

    def _shown_rows(self, verbose: bool = False) -> list[tuple[str, str, str, str, int]]:
        """rows() as the tables show them, (test, result, points, message, span), each message once: the rows with the
        same message (the tests that stopped at the same stub, say) come together, where the first of them is, and
        share its cell (span = how many rows share it, 0 for the rows after the first). So no cell has to point at
        another ("same as above" after two different messages could mean either)."""
        groups: list[list[tuple[str, str, str, str]]] = []
        where: dict[str, int] = {}
        for row in self.rows(verbose):
            message = row[3]
            if message and message in where:
                groups[where[message]].append(row)
                continue
            if message:
                where[message] = len(groups)
            groups.append([row])
        return [(*row, len(group) if k == 0 else 0) for group in groups for k, row in enumerate(group)]

    def format(self, width: int | None = None, verbose: bool = False) -> str:
        """The table as text, `width` characters wide at most (check_display.text_table; verbose: whole messages)."""
        return text_table(self, width, verbose)

    def __str__(self) -> str:
        return self.format()

    def _repr_html_(self) -> str:
        return html_table(self)


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else ""
