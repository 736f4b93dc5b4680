"""One record per graded test, one rule for points, one report file (notebook 00 shows the table it makes).

The pytest plugin writes a report as JSON lines while the tests run (so a judge killed at its time
limit still leaves the tests it finished); `check`, the instructor's grader and `course.py` read it
back with `read_report`.

    {"collected": [{"nodeid": ..., "points": 2, "not_graded": null}, ...]}   after collection
    {"started": nodeid}                                                       before each test (check's progress)
    {"test": {"nodeid": ..., "points": 2, "outcome": "passed", ...}}         after each test
    {"looped": {"ex05": ["bucket_assignment"]}}                              after a test ran out of time (loops)
    {"exitstatus": 0}                                                         at the end

Points: a test is *graded* when it carries points and ran here; a test skipped (for example one
that needs more GPUs than this machine has) is *not graded*: it counts in neither the points
earned nor the points possible.

A test that failed on an untouched stub says so on its message's first line, "ex05: bucket_assignment is not
implemented yet (hint: ...)" (`unwritten_message`, written by grading.runner); `unwritten` reads it back and
`stub_groups` gathers the tests that stopped at the same stub, so that `check`'s table and the grader's
feedback show each stub's hint once, not once per test.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["TestOutcome", "Report", "read_report", "append_record", "exercise_of", "unwritten_message", "Unwritten",
           "unwritten", "StubGroup", "stub_groups"]

_TEST_FILE = re.compile(r"test_(ex\d+)")


def exercise_of(nodeid: str) -> str:
    """'ex04' for 'tests/test_ex04_collectives.py::test_x[2]'; 'other' for a test of no exercise."""
    match = _TEST_FILE.search(nodeid.split("::")[0].rsplit("/", 1)[-1])
    return match.group(1) if match else "other"


@dataclass
class TestOutcome:
    """What happened to one test, and what it is worth (notebook 00)."""

    nodeid: str
    points: float | None = None  # None: not a graded test
    outcome: str = "failed"  # passed, failed or skipped
    message: str = ""  # why it failed or was skipped, in a line or a few
    not_graded: str | None = None  # why it cannot be graded on this machine (e.g. it needs 2 GPUs)
    duration: float = 0.0  # seconds

    __test__ = False  # not a test class, whatever pytest thinks of its name

    @property
    def graded(self) -> bool:
        return self.points is not None and not self.not_graded and self.outcome != "skipped"

    @property
    def earned(self) -> float:
        return float(self.points) if self.graded and self.outcome == "passed" else 0.0

    @property
    def possible(self) -> float:
        return float(self.points) if self.graded else 0.0

    @property
    def exercise(self) -> str:
        return exercise_of(self.nodeid)

    @property
    def hidden(self) -> bool:
        """A test from the instructor's hidden tests (the grader copies them to tests/hidden/)."""
        return self.nodeid.startswith("tests/hidden/")

    @property
    def status(self) -> str:
        """passed, failed, or 'not graded' (with the reason in `message` or `not_graded`)."""
        return self.outcome if self.graded or self.points is None else "not graded"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TestOutcome":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if not isinstance(known.get("nodeid"), str):
            raise ValueError(f"a test record without a nodeid: {data!r}")
        return cls(**known)


@dataclass
class Report:
    """Every test collected, every test finished, and pytest's exit status (None if it never finished)."""

    collected: list[TestOutcome] | None = None
    tests: dict[str, TestOutcome] = field(default_factory=dict)
    exitstatus: int | None = None
    looped: dict[str, list[str]] = field(default_factory=dict)  # exercise -> functions that ran out of time

    def graded(self) -> list[TestOutcome]:
        return [t for t in self.tests.values() if t.points is not None]


def append_record(path: str | Path, record: dict) -> None:
    """Add one line to a report file (the pytest plugin calls this)."""
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(json.dumps(record) + "\n")


def read_report(path: str | Path) -> Report | None:
    """The report at `path`, or None if there is none; lines cut short or malformed are skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    report = Report()
    for line in lines:
        try:
            record = json.loads(line)
            if "collected" in record:
                report.collected = [TestOutcome.from_dict(t) for t in record["collected"]]
            elif "test" in record:
                test = TestOutcome.from_dict(record["test"])
                report.tests[test.nodeid] = test
            elif "looped" in record:
                report.looped = {str(k): [str(f) for f in v] for k, v in record["looped"].items()}
            elif "exitstatus" in record:
                report.exitstatus = int(record["exitstatus"])
        except (ValueError, TypeError, AttributeError):
            continue  # a line cut short when the judge was killed, or not ours
    return report


# ------------------------------------------------------------------------------------------------ untouched stubs


_UNWRITTEN = re.compile(r"^(?P<exercise>[^\s:]+): (?:(?P<function>\S+) is )?not implemented yet"
                        r"(?: \(hint: (?P<hint>.*)\))?\s*$")


def unwritten_message(exercise: str, function: str, hint: str) -> str:
    """A test's message when it stopped at an untouched stub: 'ex05: f is not implemented yet (hint: ...)'."""
    return f"{exercise}: " + (f"{function} is " if function else "") + "not implemented yet" + (
        f" (hint: {hint})" if hint else "")


@dataclass(frozen=True)
class Unwritten:
    """The untouched stub a test stopped at: its exercise, its function and the stub's hint."""

    exercise: str
    function: str  # '' in a message that does not name it
    hint: str

    @property
    def message(self) -> str:
        return unwritten_message(self.exercise, self.function, self.hint)

    @property
    def name(self) -> str:
        """'ex05 · bucket_assignment'"""
        return f"{self.exercise} · {self.function or '(a stub)'}"


def unwritten(test: TestOutcome) -> Unwritten | None:
    """The stub a failed test stopped at, or None: it failed some other way (or did not fail)."""
    if test.outcome != "failed":
        return None
    lines = (test.message or "").strip().splitlines()
    match = _UNWRITTEN.match(lines[0]) if lines else None
    if match is None:
        return None
    return Unwritten(match["exercise"], match["function"] or "", match["hint"] or "")


@dataclass
class StubGroup:
    """The tests that stopped at one untouched stub, in the order they ran."""

    stub: Unwritten
    tests: list[TestOutcome] = field(default_factory=list)

    __test__ = False

    @property
    def possible(self) -> float:
        return sum(t.possible for t in self.tests)

    def counts(self) -> str:
        """'3 tests, 6 points'"""
        n, points = len(self.tests), self.possible
        return f"{n} test{'' if n == 1 else 's'}, {points:g} point{'' if points == 1 else 's'}"


def stub_groups(tests: list[TestOutcome]) -> list[StubGroup]:
    """The failed tests that stopped at an untouched stub, one group per stub, in the order of their first test."""
    groups: dict[Unwritten, StubGroup] = {}
    for test in tests:
        stub = unwritten(test)
        if stub is not None:
            groups.setdefault(stub, StubGroup(stub)).tests.append(test)
    return list(groups.values())
