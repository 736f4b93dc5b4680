"""The results record: one rule for points earned and possible, and a report that survives being cut short."""

from __future__ import annotations

import pytest

from course_lib.grading import exception_raised_by
from course_lib.grading.results import TestOutcome, append_record, read_report


@pytest.mark.parametrize("outcome, not_graded, earned, possible", [
    ("passed", None, 3, 3),
    ("failed", None, 0, 3),
    ("skipped", None, 0, 0),  # skipped at run time: not graded, in check() and in the grader alike
    ("skipped", "needs 2 CUDA GPUs; this machine has 0", 0, 0),
    ("passed", "needs 2 CUDA GPUs; this machine has 0", 0, 0),
])
def test_one_rule_for_earned_and_possible(outcome, not_graded, earned, possible):
    test = TestOutcome("tests/test_ex05_ddp.py::test_x[2]", 3, outcome, not_graded=not_graded)
    assert (test.earned, test.possible) == (earned, possible)
    assert test.status == (outcome if possible else "not graded")
    assert test.exercise == "ex05" and not test.hidden


def test_a_test_without_points_counts_nothing():
    test = TestOutcome("tests/course/test_x.py::test_y", None, "passed")
    assert (test.earned, test.possible, test.status) == (0, 0, "passed")


def test_a_report_cut_short_keeps_the_tests_it_finished(tmp_path):
    path = tmp_path / "report.jsonl"
    append_record(path, {"collected": [TestOutcome("tests/test_ex00_a.py::t", 2, "collected").to_dict()]})
    append_record(path, {"test": TestOutcome("tests/test_ex00_a.py::t", 2, "passed").to_dict()})
    with open(path, "a") as stream:
        stream.write('{"test": {"nodeid": "tests/test_ex00_a.py::u", "poi')  # the judge was killed here
    report = read_report(path)
    assert report.exitstatus is None  # never finished: the grader says so
    assert list(report.tests) == ["tests/test_ex00_a.py::t"] and report.tests["tests/test_ex00_a.py::t"].earned == 2
    assert [t.nodeid for t in report.collected] == ["tests/test_ex00_a.py::t"]
    assert read_report(tmp_path / "missing.jsonl") is None


def _raises_value_error(x):
    raise ValueError(f"bad {x}")


def _not_written(x):
    raise NotImplementedError("hint")


def test_exception_raised_by_names_the_exception_and_lets_not_implemented_through():
    assert exception_raised_by(_raises_value_error, 3) == ["ValueError", "bad 3"]
    assert exception_raised_by(abs, -1) == ["returned", ""]
    with pytest.raises(NotImplementedError):
        exception_raised_by(_not_written, 1)
