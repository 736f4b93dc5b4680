"""The student release: stubs and no solutions, no grader, no notebook that quotes a solution, and a learner's
README whose every command works in the release."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from course_lib.instructor.exercises import expected_stubs
from course_lib.instructor.grade.submissions import collect_exercise_files
from course_lib.instructor.release import LEARNER_README, main, make_release
from course_lib.paths import ROOT, SOLUTIONS

needs_solutions = pytest.mark.skipif(not (SOLUTIONS / "ex00_warmup.py").exists(),
                                     reason="needs the reference solutions (not in the student release)")

# What a learner's README must not explain: the grader, its sandbox and its weak spots, the instructor's tools.
INTERNALS = ("bubblewrap", "bwrap", "sandbox", "unshare", "allow-list", "isolation", "mount namespace", "judge",
             "course_lib.grade", "course.py grade", "course.py release", "course.py selfcheck", "solutions/",
             "wrong answer", "mutation", "For the instructor", "For course developers", "--target", "issue")


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    if not (SOLUTIONS / "ex00_warmup.py").exists():
        pytest.skip("needs the reference solutions (not in the student release)")
    folder = tmp_path_factory.mktemp("release") / "course"
    return folder, make_release(folder)


def test_release_has_stubs_and_no_solutions_wrong_answers_or_grader(release):
    folder, written = release
    assert not (folder / "solutions").exists() and not (folder / "benchmarks").exists()
    stubs = expected_stubs(ROOT / "solutions")
    assert {p.name: p.read_text() for p in (folder / "exercises").glob("ex*.py")} == stubs
    assert (folder / "course.py").exists() and (folder / "tests" / "test_ex00_warmup.py").exists()
    assert (folder / "course_lib" / "check.py").exists() and (folder / "course_lib" / "grading" / "plugin.py").exists()
    for withheld in ("course_lib/instructor", "course_lib/grade.py", "course_lib/exercises.py", "tests/course", "docs"):
        assert not (folder / withheld).exists(), withheld
    assert not any("wrong_answers" in p.parts or "instructor" in p.parts for p in written)
    assert not any("BEGIN SOLUTION" in p.read_text() for p in (folder / "exercises").rglob("*"))


def test_the_readme_is_the_learners_without_the_grader_or_its_sandbox(release):
    folder, _ = release
    readme = (folder / "README.md").read_text()
    assert readme == LEARNER_README.read_text() and readme != (ROOT / "README.md").read_text()
    lowered = readme.lower()
    assert [word for word in INTERNALS if word.lower() in lowered] == []
    for needed in ("python3 course.py lab", "python3 course.py check ex01", 'check("ex01")', "exercises.zip",
                   "exNN_*.py", "notebooks/00_welcome.ipynb"):
        assert needed in readme, needed
    # No page of the release explains the grader's sandbox (the repository's README did).
    for path in folder.rglob("*"):
        if path.is_file() and path.suffix in (".md", ".ipynb", ".txt"):
            text = path.read_text(errors="replace")
            assert "For the instructor" not in text and "allow-list" not in text, path


def _commands(readme: str) -> list[str]:
    """The shell commands of the README's ```bash blocks."""
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_every_command_the_readme_shows_exists_in_the_release(release):
    folder, _ = release
    commands = _commands((folder / "README.md").read_text())
    assert "python3 course.py lab" in commands and "python3 course.py check ex01" in commands
    course_py = (folder / "course.py").read_text()
    for command in commands:
        words = command.split()
        if words[:2] == ["python3", "course.py"]:
            assert re.search(rf"""["']{re.escape(words[2])}["']""", course_py), f"course.py has no {words[2]!r}"
            if words[2] == "check":
                assert any((folder / "exercises").glob(f"{words[3]}_*.py")), command
        elif words[0] == "conda":
            assert words[1:3] != ["env", "create"] or (folder / words[-1]).exists(), command
        else:
            assert words[:3] == ["python3", "-m", "zipfile"], f"a command this test does not know: {command}"
    assert (folder / "notebooks" / "00_welcome.ipynb").exists()


@pytest.mark.timeout(300)
def test_check_works_in_the_release_and_the_zip_it_says_to_hand_in_is_graded(release, tmp_path):
    """What `python3 course.py check ex00` runs (course_lib.check in the release's folder: there is no solutions/
    there), on a finished exercise; then the README's zip command, read as the grader reads a submission."""
    folder, _ = release
    work = tmp_path / "course"
    shutil.copytree(folder, work)
    shutil.copy(SOLUTIONS / "ex00_warmup.py", work / "exercises" / "ex00_warmup.py")  # the learner finished ex00
    done = subprocess.run([sys.executable, "-m", "course_lib.check", "ex00"], cwd=work, capture_output=True, text=True,
                          timeout=280)
    assert done.returncode == 0 and "ex00: 7 / 7 points" in done.stdout, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    zip_command = next(c for c in _commands((work / "README.md").read_text()) if "zipfile" in c).split()
    subprocess.run([sys.executable, *zip_command[1:]], cwd=work, check=True, timeout=60)
    files, where = collect_exercise_files(work / "exercises.zip")
    assert set(files) == {p.name for p in (work / "exercises").glob("ex*.py")} and where == "exercises"
    assert files["ex00_warmup.py"] == (SOLUTIONS / "ex00_warmup.py").read_bytes()


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
    (course / "README.md").write_text("# The instructor's README\n## For the instructor\n")
    with pytest.raises(SystemExit, match="release not made"):
        make_release(tmp_path / "out", root=course)
    assert not (tmp_path / "out").exists()
    (course / "notebooks" / "09.ipynb").write_text(json.dumps({"cells": []}))
    make_release(tmp_path / "out", root=course)
    assert "NotImplementedError('multiply')" in (tmp_path / "out" / "exercises" / "ex09_demo.py").read_text()
    assert (tmp_path / "out" / "README.md").read_text() == LEARNER_README.read_text()


def test_bad_output_folders_get_a_message_and_the_usage_names_course_py(tmp_path, capsys):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(SystemExit, match="is a file"):
        make_release(tmp_path / "a-file")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(SystemExit, match="not empty"):
        make_release(tmp_path / "full")
    with pytest.raises(SystemExit):
        main(["--help"])
    usage = capsys.readouterr().out
    assert "python3 course.py release" in usage and "course_lib.release " not in usage
