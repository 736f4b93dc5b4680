"""The student release: stubs and no solutions, and no notebook that quotes a solution."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from course_lib.instructor.exercises import expected_stubs
from course_lib.instructor.release import make_release
from course_lib.paths import ROOT, SOLUTIONS

needs_solutions = pytest.mark.skipif(not (SOLUTIONS / "ex00_warmup.py").exists(),
                                     reason="needs the reference solutions (not in the student release)")


@needs_solutions
def test_release_has_stubs_and_no_solutions(tmp_path):
    written = make_release(tmp_path / "release")
    release = tmp_path / "release"
    assert not (release / "solutions").exists() and not (release / "benchmarks").exists()
    stubs = expected_stubs(ROOT / "solutions")
    assert {p.name: p.read_text() for p in (release / "exercises").glob("ex*.py")} == stubs
    assert (release / "course.py").exists() and (release / "tests" / "test_ex00_warmup.py").exists()
    assert Path("course_lib/instructor/grade/judge.py") in written
    assert not any("BEGIN SOLUTION" in p.read_text() for p in (release / "exercises").rglob("*"))


def test_release_refuses_a_notebook_that_quotes_a_solution(tmp_path):
    course = tmp_path / "course"
    (course / "solutions").mkdir(parents=True)
    (course / "solutions" / "ex09_demo.py").write_text(
        "def area(width, height):\n    \"\"\"Area.\"\"\"\n    # BEGIN SOLUTION: multiply\n"
        "    result = width * height  # the width times the height\n    return float(result)\n    # END SOLUTION\n")
    (course / "notebooks").mkdir()
    notebook = {"cells": [{"cell_type": "code", "source": ["def area(width, height):\n",
                                                           "    result = width * height\n",
                                                           "    return float(result)\n"]}]}
    (course / "notebooks" / "09.ipynb").write_text(json.dumps(notebook))
    with pytest.raises(SystemExit, match="release not made"):
        make_release(tmp_path / "out", root=course)
    assert not (tmp_path / "out").exists()
    (course / "notebooks" / "09.ipynb").write_text(json.dumps({"cells": []}))
    make_release(tmp_path / "out", root=course)
    assert "NotImplementedError('multiply')" in (tmp_path / "out" / "exercises" / "ex09_demo.py").read_text()
