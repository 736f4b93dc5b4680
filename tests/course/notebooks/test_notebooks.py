"""Every lesson runs top to bottom on this machine, and is committed in its clean form: no outputs, no execution
counts, only the course's kernel metadata (the form `python3 course.py release` writes, `clean_notebook`).

The kernels run with COURSE_QUICK=1 (course_lib.timing.quick): a lesson may shrink its sizes, running the same
code. tests/course/browser runs every lesson again, in JupyterLab in Chromium, and looks at what it shows.
"""

from __future__ import annotations


import nbformat
import pytest

from course_lib import paths
from course_lib.instructor.release import clean_notebook
from course_lib.timing import QUICK_VARIABLE
from notebook_runner import execute, problems

NOTEBOOKS = sorted(paths.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def test_there_are_lessons():
    assert [p.name[:2] for p in NOTEBOOKS][:2] == ["00", "01"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    dirty = [i for i, c in enumerate(notebook.cells)
             if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    cleared = clean_notebook(notebook)
    assert not cleared, (f"{path.name} is committed with {', '.join(cleared)} (cells {dirty} have outputs or counts); "
                         "clear them before committing (course_lib.instructor.release.clean_notebook)")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_this_machine_without_errors(path, monkeypatch):
    monkeypatch.setenv(QUICK_VARIABLE, "1")   # the kernel inherits it
    notebook = nbformat.read(path, as_version=4)
    seconds = execute(notebook, cwd=path.parent)
    found = problems(notebook)
    assert not found, f"{path.name} produced error output:\n" + "\n".join(found)
    print(f"{path.name}: {seconds:.1f} s")
