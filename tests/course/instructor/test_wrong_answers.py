"""The wrong-answer checker (course_lib.instructor.wrong_answers) on a tiny course of its own: it must name what it misses."""

from __future__ import annotations

import textwrap
from pathlib import Path

from course_lib.instructor import wrong_answers
from course_lib.paths import ROOT


SOLUTION = '''"""Exercise 99: a demo."""


def double(x):
    """Twice x."""
    # BEGIN SOLUTION: multiply by two
    return 2 * x
    # END SOLUTION


def halve(x):
    """Half of x."""
    # BEGIN SOLUTION: divide by two
    return x / 2
    # END SOLUTION
'''

TESTS = '''"""Graded tests of the demo exercise: they load the graded file directly (no ranks needed here)."""
import importlib.util

import pytest


def _load(target):
    path = next(target.glob("ex99_*.py"))
    spec = importlib.util.spec_from_file_location("ex99_demo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.points(2)
def test_double(target):
    assert _load(target).double(3) == 6


@pytest.mark.points(1)
@pytest.mark.parametrize("x", [0, 2])
def test_double_of_each(target, x):
    assert _load(target).double(x) == 2 * x


@pytest.mark.points(1)
def test_halve(target):
    assert _load(target).halve(3) == 1.5
'''

WRONG = {
    # Caught: 3 + 2 != 6 and 0 + 2 != 0, while 2 + 2 == 4 passes: losing one parametrization is enough.
    "adds_two": ('Adds two instead of doubling.', ["test_double", "test_double_of_each"],
                 "def double(x):\n    return x + 2\n"),
    # Not caught: this "wrong" answer is right, so it must be reported.
    "actually_right": ('Doubles by adding x to itself (which is right).', ["test_double"],
                       "def double(x):\n    return x + x\n"),
    # Targets a test that does not exist.
    "unknown_test": ("Halves with integer division.", ["test_halves"], "def halve(x):\n    return x // 2\n"),
    # Redefines a function the solution does not have: it would replace nothing.
    "wrong_name": ("Doubles twice.", ["test_double"], "def dubble(x):\n    return 4 * x\n"),
}


def _fake_course(root: Path) -> None:
    (root / "solutions" / "wrong_answers" / "ex99").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "solutions" / "ex99_demo.py").write_text(SOLUTION)
    (root / "tests" / "test_ex99_demo.py").write_text(TESTS)
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p course_lib.grading.plugin\n")
    for name, (mistake, loses, code) in WRONG.items():
        (root / "solutions" / "wrong_answers" / "ex99" / f"{name}.py").write_text(
            f'"""{mistake}"""\n\nLOSES = {loses!r}\n\n\n{code}')
    (root / "solutions" / "wrong_answers" / "ex99" / "no_docstring.py").write_text(
        textwrap.dedent('''\
        LOSES = ["test_halve"]

        def halve(x):
            return x * 2
        '''))


def test_the_checker_reports_each_kind_of_failure(tmp_path, capsys):
    _fake_course(tmp_path)
    code = wrong_answers.main(["--root", str(tmp_path), "--jobs", "3"])
    out = capsys.readouterr().out
    assert code == 1, out
    failed = {line.split(":", 2)[1].strip().removeprefix("ex99/"): line for line in out.splitlines()
              if line.startswith("FAILED: ")}
    assert set(failed) == {"actually_right.py", "unknown_test.py", "wrong_name.py", "no_docstring.py"}, out
    assert "lost no points on test_double" in failed["actually_right.py"]
    assert "test_halves" in failed["unknown_test.py"]
    assert "redefines no function of the solution" in failed["wrong_name.py"]
    assert "docstring" in failed["no_docstring.py"]
    assert "1 of 5 wrong answers lose points" in out
    # The caught one: 2 points of test_double and 1 of the 2 of test_double_of_each.
    row = next(line for line in out.splitlines() if line.startswith("ex99") and "adds_two" in line)
    assert "3 / 4" in row and "loses points" in row, row


def test_a_wrong_answer_may_redefine_a_class(tmp_path):
    path = tmp_path / "prefetch_no_wait.py"
    path.write_text('"""Never waits."""\n\nLOSES = ["test_prefetcher"]\n\n\nclass Prefetcher(Prefetcher):\n    pass\n')
    wrong = wrong_answers._read("ex02", path)
    assert not wrong.problems and wrong.loses == ["test_prefetcher"]


def test_only_the_named_exercises_are_checked(tmp_path, capsys):
    _fake_course(tmp_path)
    (tmp_path / "solutions" / "wrong_answers" / "ex98").mkdir()
    assert wrong_answers.main(["--root", str(tmp_path), "ex98"]) == 1
    assert "no wrong answers found" in capsys.readouterr().out
    assert [w.name for w in wrong_answers.discover(tmp_path, ["ex99"])] == [
        "actually_right", "adds_two", "no_docstring", "unknown_test", "wrong_name"]


def test_without_solutions_there_is_nothing_to_check(tmp_path, capsys):
    assert wrong_answers.main(["--root", str(tmp_path)]) == 0
    assert "no solutions/" in capsys.readouterr().out


def test_every_suite_of_the_course_is_well_formed():
    """Cheap checks of the real suites (the slow check that each loses points is course.py test's step 2)."""
    wrongs = wrong_answers.discover(ROOT)
    if not (ROOT / "solutions").is_dir():
        return  # a student release
    problems = [f"{w.exercise}/{w.path.name}: {'; '.join(w.problems)}" for w in wrongs if w.problems]
    assert not problems, "\n".join(problems)
    by_exercise: dict[str, int] = {}
    for wrong in wrongs:
        by_exercise[wrong.exercise] = by_exercise.get(wrong.exercise, 0) + 1
        tests = wrong_answers._test_file(ROOT, wrong.exercise)
        assert tests is not None, f"{wrong.exercise}: no graded tests"
        unknown = set(wrong.loses) - wrong_answers._graded_names(tests)
        assert not unknown, f"{wrong.exercise}/{wrong.path.name}: LOSES names no test: {unknown}"
    for solution in sorted((ROOT / "solutions").glob("ex*_*.py")):
        exercise = solution.name.split("_")[0]
        assert by_exercise.get(exercise, 0) >= 3, f"{exercise} needs at least 3 wrong answers"
