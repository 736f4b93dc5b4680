"""A stub, a hang or a memory kill fails a property test at once: Hypothesis tries no other input (issue 20)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from course_lib.grading.results import read_report
from course_lib.paths import ROOT


def test_a_stub_fails_a_property_test_on_its_first_input(tmp_path):
    (tmp_path / "ex77_demo.py").write_text("def double(x):\n    raise NotImplementedError('return 2 * x')\n")
    test = tmp_path / "test_ex77_demo.py"
    test.write_text(textwrap.dedent("""
        import pytest
        from hypothesis import given, settings, strategies as st
        from course_lib.grading import call

        CALLS = []

        @pytest.mark.points(1)
        @settings(max_examples=10)
        @given(st.integers(0, 10**6))
        def test_double(x):
            CALLS.append(x)
            assert call("ex77", "double", x) == 2 * x

        def test_tried_once():
            assert len(CALLS) == 1, CALLS
        """))
    report = tmp_path / "report.jsonl"
    done = subprocess.run([sys.executable, "-m", "pytest", str(test), "--rootdir", str(ROOT), "-c",
                           str(ROOT / "pyproject.toml"), "--target", str(tmp_path), "--course-report", str(report),
                           "-q", "-p", "no:randomly"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    tests = {t.nodeid.split("::")[-1]: t for t in read_report(report).tests.values()}
    assert tests["test_double"].outcome == "failed", done.stdout[-2000:]
    assert tests["test_double"].message.startswith("ex77: double is not implemented yet (hint: return 2 * x)")
    assert tests["test_tried_once"].outcome == "passed", tests["test_tried_once"].message


DEMO = '''import torch


def double(x):
    """Twice x."""
    raise NotImplementedError('return 2 * x')


def half(x):
    if x < 0:
        raise NotImplementedError("negative numbers: later")  # the learner's own, in a half-written function
    return x / 2


def nonzero_on_meta(x):
    return torch.ones(2, device="meta").nonzero()  # torch raises NotImplementedError: meta has no nonzero


def triple(x):
    raise NotImplementedError('write triple')


def checks_its_input(x):
    raise NotImplementedError('return 2 * x')
'''


def _failure(exercise: str, function: str, *args, **kwargs) -> BaseException:
    from course_lib.grading.runner import ExerciseFailed, ExerciseStopped, run

    try:
        run(exercise, _in_ranks if "world_size" in kwargs else _call, function, *args, **kwargs)
    except (ExerciseFailed, ExerciseStopped) as error:
        return error
    raise AssertionError(f"{function} did not fail")


def _call(module, function, *args):
    return getattr(module, function)(*args)


def _in_ranks(rank, world_size, module, function, *args):
    from course_lib.grading.runner import exception_raised_by

    return exception_raised_by(getattr(module, function), *args)


def test_only_an_untouched_stubs_not_implemented_error_reads_as_not_implemented_yet(tmp_path, monkeypatch):
    from course_lib.grading import runner
    from course_lib.grading.results import TestOutcome, unwritten

    (tmp_path / "ex77_demo.py").write_text(DEMO)
    hints = tmp_path / "stub_hints.json"
    hints.write_text('{"ex77": ["return 2 * x"]}')
    monkeypatch.setattr(runner, "STUB_HINTS", hints)  # the stubs' hints, as course.py exercises writes them
    stopped = _failure("ex77", "double", 3, target=tmp_path)
    assert isinstance(stopped, runner.ExerciseStopped)
    assert str(stopped) == "ex77: double is not implemented yet (hint: return 2 * x)"
    assert unwritten(TestOutcome("t", 1, "failed", str(stopped))).function == "double"
    # exception_raised_by raises a stub's NotImplementedError again, in ranks as in one child
    assert str(_failure("ex77", "checks_its_input", 3, target=tmp_path, world_size=2)) == (
        "ex77: checks_its_input is not implemented yet (hint: return 2 * x)")
    for function, says in [("half", "NotImplementedError: negative numbers: later"),
                           ("nonzero_on_meta", "NotImplementedError"),
                           ("triple", "NotImplementedError: write triple")]:  # the shape of a stub, not its hint
        error = _failure("ex77", function, -1, target=tmp_path)
        assert isinstance(error, runner.ExerciseFailed) and says in str(error).splitlines()[0], (function, error)
        assert "not implemented yet" not in str(error) and "Traceback" in str(error)
    # Where the exercise's hints are not known, the shape of a stub tells: the function's first statement.
    monkeypatch.setattr(runner, "STUB_HINTS", tmp_path / "none.json")
    assert str(_failure("ex77", "triple", 1, target=tmp_path)) == (
        "ex77: triple is not implemented yet (hint: write triple)")
    assert "not implemented yet" not in str(_failure("ex77", "half", -1, target=tmp_path))


def test_every_stub_hint_of_the_course_is_recorded_for_the_runner():
    from course_lib.grading.runner import STUB_HINTS
    from course_lib.paths import SOLUTIONS

    if not SOLUTIONS.is_dir():
        pytest.skip("a student release: no solutions/ to compare with")
    from course_lib.instructor.exercises import stub_hints_text

    assert STUB_HINTS.read_text(encoding="utf-8") == stub_hints_text(), (
        f"{STUB_HINTS.name} is out of date: run python3 course.py exercises")
