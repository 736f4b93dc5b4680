"""The student release: stubs and no solutions, no grader, no notebook that quotes a solution or carries the
instructor's outputs and kernel, and a learner's README whose every command works in the release."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output, new_raw_cell

from course_lib.instructor.exercises import expected_stubs
from course_lib.instructor.grade.submissions import collect_exercise_files
from course_lib.instructor.release import (KERNELSPEC, LEARNER_README, clean_notebook, main, make_release,
                                           write_notebook)
from course_lib.paths import NOTEBOOKS, ROOT, SOLUTIONS
from course_lib.timing import QUICK_VARIABLE
from notebook_runner import execute

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
    notebook = new_notebook(cells=[new_code_cell("def area(width, height):\n    result = width * height\n"
                                                 "    return float(result)\n")])
    nbformat.write(notebook, course / "notebooks" / "09.ipynb")
    (course / "README.md").write_text("# The instructor's README\n## For the instructor\n")
    with pytest.raises(SystemExit, match="release not made"):
        make_release(tmp_path / "out", root=course)
    assert not (tmp_path / "out").exists()
    nbformat.write(new_notebook(), course / "notebooks" / "09.ipynb")
    make_release(tmp_path / "out", root=course)
    assert "NotImplementedError('multiply')" in (tmp_path / "out" / "exercises" / "ex09_demo.py").read_text()
    assert (tmp_path / "out" / "README.md").read_text() == LEARNER_README.read_text()
    (course / "notebooks" / "09.ipynb").write_text('{"cells": [')   # a merge gone wrong: no release
    with pytest.raises(SystemExit, match=r"notebooks/09.ipynb is not a notebook nbformat can read"):
        make_release(tmp_path / "out2", root=course)
    assert not (tmp_path / "out2").exists()


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


# ------------------------------------------------------------------------------ notebooks in their clean form


def _dirty_notebook() -> nbformat.NotebookNode:
    """A notebook as an instructor's JupyterLab saves it after running it: outputs, counts, timings, widget state,
    the kernel's language_info and the instructor's own kernel; and an author's tags and a hidden cell's source."""
    cells = [
        new_markdown_cell("# A lesson · 00", metadata={"tags": ["intro"], "jp-MarkdownHeadingCollapsed": True}),
        new_code_cell("print(1)\n1 + 1", execution_count=3, outputs=[
            new_output("stream", name="stdout", text="1\n"),
            new_output("execute_result", data={"text/plain": "2"}, execution_count=3)],
            metadata={"tags": ["exercise"], "scrolled": True, "collapsed": False, "jupyter": {"outputs_hidden": True},
                      "execution": {"iopub.status.busy": "2026-01-05T09:00:00.000001Z",
                                    "shell.execute_reply": "2026-01-05T09:00:01.000001Z"},
                      "ExecuteTime": {"start_time": "2026-01-05T09:00:00.000Z", "end_time": "2026-01-05T09:00:01Z"}}),
        new_code_cell("x = 1", execution_count=4, metadata={"jupyter": {"source_hidden": True, "outputs_hidden": True}}),
        new_code_cell("raise ValueError", outputs=[new_output("error", ename="ValueError", evalue="", traceback=[])]),
        new_raw_cell("raw text", metadata={"editable": False}),
    ]
    return new_notebook(cells=cells, metadata={
        "kernelspec": {"display_name": "Python (multigpu)", "language": "python", "name": "multigpu"},
        "language_info": {"name": "python", "version": "3.11.7", "mimetype": "text/x-python",
                          "codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py"},
        "widgets": {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2,
                                                                   "version_minor": 0}}})


def test_clean_notebook_clears_what_running_and_jupyterlab_add_and_keeps_the_authors_metadata(tmp_path):
    notebook = _dirty_notebook()
    nbformat.validate(notebook)
    cleared = clean_notebook(notebook)
    assert cleared == ["outputs of 2 cells", "2 execution counts", "kernel metadata", "notebook metadata widgets",
                       "cell metadata execution (1 cell)", "cell metadata collapsed (1 cell)",
                       "cell metadata scrolled (1 cell)", "cell metadata ExecuteTime (1 cell)",
                       "cell metadata jp-MarkdownHeadingCollapsed (1 cell)",
                       "cell metadata jupyter.outputs_hidden (2 cells)"]
    nbformat.validate(notebook)
    assert notebook.metadata == {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert [(c.outputs, c.execution_count) for c in code] == [([], None)] * 3
    assert [c.metadata for c in notebook.cells] == [{"tags": ["intro"]}, {"tags": ["exercise"]},
                                                    {"jupyter": {"source_hidden": True}}, {}, {"editable": False}]
    assert [c.source for c in notebook.cells] == [c.source for c in _dirty_notebook().cells]
    assert clean_notebook(notebook) == []   # clean stays clean
    # Written in the repository's layout: a committed lesson, read and written back, is the same bytes.
    write_notebook(notebook, tmp_path / "clean.ipynb")
    text = (tmp_path / "clean.ipynb").read_text(encoding="utf-8")
    assert text.startswith('{\n "cells": [\n  {\n') and text.endswith("}\n") and "# A lesson · 00" in text
    lesson = NOTEBOOKS / "00_welcome.ipynb"
    write_notebook(nbformat.read(lesson, as_version=4), tmp_path / "lesson.ipynb")
    assert (tmp_path / "lesson.ipynb").read_bytes() == lesson.read_bytes()


@pytest.mark.timeout(120)
def test_release_clears_a_lesson_that_was_run_and_saved(tmp_path, capsys, monkeypatch):
    """Lesson 00's first two code cells run in a real kernel (nbclient), and the notebook saved as JupyterLab
    saves it: the release holds the committed clean form, and says what it cleared."""
    course = tmp_path / "course"
    shutil.copytree(SOLUTIONS, course / "solutions")
    shutil.copytree(NOTEBOOKS, course / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    (course / "README.md").write_text("# The instructor's README\n")
    lesson = course / "notebooks" / "00_welcome.ipynb"
    clean = lesson.read_bytes()
    notebook = nbformat.reads(clean.decode("utf-8"), as_version=4)
    first_two = [i for i, c in enumerate(notebook.cells) if c.cell_type == "code"][:2]
    ran = nbformat.from_dict({**notebook, "cells": notebook.cells[:first_two[-1] + 1]})
    monkeypatch.setenv(QUICK_VARIABLE, "1")
    execute(ran, cwd=NOTEBOOKS)   # records each cell's timing in its metadata, as JupyterLab's recordTiming does
    notebook.cells[:len(ran.cells)] = ran.cells
    notebook.metadata = ran.metadata   # the kernel's language_info, with its Python version
    notebook.metadata.kernelspec = {"display_name": "Python (multigpu)", "language": "python", "name": "multigpu"}
    write_notebook(notebook, lesson)
    assert all(notebook.cells[i].outputs and notebook.cells[i].execution_count for i in first_two)
    assert "version" in notebook.metadata.language_info and lesson.read_bytes() != clean

    make_release(tmp_path / "out", root=course)
    released = tmp_path / "out" / "notebooks" / "00_welcome.ipynb"
    assert released.read_bytes() == clean
    notebook = nbformat.read(released, as_version=4)
    nbformat.validate(notebook)
    assert not [c for c in notebook.cells if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert notebook.metadata == {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    for other in sorted(NOTEBOOKS.glob("*.ipynb")):   # the clean ones are copied as they are
        if other.name != lesson.name:
            assert (tmp_path / "out" / "notebooks" / other.name).read_bytes() == other.read_bytes(), other.name
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("notebooks:"))
    lessons = len(list(NOTEBOOKS.glob("*.ipynb")))
    assert line.startswith(f"notebooks: outputs, execution counts and kernel metadata cleared in 1 of {lessons} "
                           "(00_welcome.ipynb: outputs of 2 cells, 2 execution counts, kernel metadata"), line
    assert line.endswith("cell metadata execution (2 cells))"), line
