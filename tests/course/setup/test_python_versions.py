"""The course runs on every Python pyproject.toml's requires-python admits (>=3.10), although CI runs one (3.11):
vermin reads the course's code, the lessons' code cells included, and finds nothing newer than 3.10 in it
(tomllib, datetime.UTC, typing.Self, except*, ExceptionGroup, asyncio.TaskGroup, ...).

vermin is in pyproject.toml's `test` extra. It sees an `if sys.version_info >= (3, 11):` guard at a module's top
level only (not in a function, and not `try: import x / except ImportError:`): the tests read pyproject.toml
through tests/course/pyproject_toml.py, which falls back to tomli there. It also took `texts[name].decode()` (bytes
from a zip) for Python 2's str.decode once: such a line is written otherwise. The code passes with no exclusion (no
--exclude, no `# novm` comment); one added later must say, beside it, why the code is right on 3.10 anyway.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from course_lib.paths import ROOT

OLDEST = "3.10"  # pyproject.toml's requires-python
FOLDERS = ["course.py", "course_lib", "solutions", "exercises", "tests", "benchmarks"]
VERMIN = [
    "--no-config-file", "--no-tips", "--violations", f"--target={OLDEST}-",
    # Stricter than Python itself: annotations are read as if evaluated (most modules have `from __future__ import
    # annotations`, which keeps them strings; a `typing.get_type_hints` would evaluate them all the same).
    "--eval-annotations",
    "-vvv",  # line and column of each finding
]


def _requires_python() -> str:
    return re.search(r'^requires-python\s*=\s*">=([0-9.]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


def _notebook_cells(folder) -> int:
    """Each lesson's code cells as files folder/NN_topic/cell_ID.py, IPython's syntax (%magic, name??) turned into
    the Python IPython runs; the number of files written."""
    from IPython.core.inputtransformer2 import TransformerManager

    transform, written = TransformerManager(), 0
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for index, cell in enumerate(cells):
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            target = folder / path.stem / f"cell_{cell.get('id') or index}.py"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(transform.transform_cell(source), encoding="utf-8")
            written += 1
    return written


def test_the_oldest_python_checked_is_the_one_pyproject_admits():
    assert _requires_python() == OLDEST


def test_nothing_in_the_course_needs_a_python_newer_than_the_oldest_it_admits(tmp_path):
    try:
        import vermin  # noqa: F401
    except ImportError:
        pytest.fail("vermin is not installed: it is in pyproject.toml's test extra (pip install -e '.[test]')")
    cells = _notebook_cells(tmp_path / "notebooks")
    assert cells > 100, f"only {cells} code cells found in notebooks/"
    command = [sys.executable, "-c", "import sys; from vermin import main; sys.exit(main())", *VERMIN,
               *[str(ROOT / name) for name in FOLDERS], str(tmp_path / "notebooks")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    analysed = re.search(r"Analyzing (\d+) files", done.stdout)
    assert analysed and int(analysed.group(1)) > 500, done.stdout + done.stderr  # every folder was read
    assert done.returncode == 0, (
        f"vermin finds code that needs a Python newer than {OLDEST} (the notebooks' cells are under "
        f"{tmp_path / 'notebooks'}/LESSON/cell_ID.py):\n{done.stdout}{done.stderr}")
