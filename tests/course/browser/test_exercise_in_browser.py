"""A learner's first exercise, done by hand in JupyterLab in headless Chromium, as notebook 00 tells them to.

    python3 course.py test -m browser -k exercise

The server serves a copy of the course (browser_lab.copy_course) the way `python3 course.py lab` serves the course:
its start page opens notebooks/00_welcome.ipynb, and the file browser's root is the course's folder. The test runs
the check cell on the untouched stub (0 of N points), opens exercises/ex00_*.py by clicking through the file
browser (its root, then exercises/, then the file), replaces the editor's text with the stub completed by the
solution's bodies (solutions/ex00_*.py, between `# BEGIN SOLUTION` and `# END SOLUTION`), saves with Ctrl+S,
goes back to the notebook's tab, runs the check cell again, and reads N of N points from the table in the page.

The kernels import the copy's own course_lib, so `check("ex00")` grades the copy's exercises/: the repository's
exercises/ are never written (the test asserts they are unchanged). The server, its kernels and the browser are
stopped when the test ends, pass or fail (and conftest's no_process_left_behind checks that nothing is left).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

import pytest

from course_lib import paths

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

try:
    import playwright  # noqa: F401
except ImportError:
    pytest.skip("the browser tests need the Python package playwright: `python3 course.py test` installs it "
                "(or: pip install -e '.[browser]')", allow_module_level=True)

import browser_lab  # noqa: E402
from browser_lab import (FIRST_NOTEBOOK, check_points, chromium, copy_course, current_tab,  # noqa: E402
                         jupyter_lab, open_from_file_browser, replace_editor_text, run_cell, save_editor,
                         switch_to_tab, wait_for_idle_kernel)

try:
    CHROMIUM = browser_lab.chromium_path()
except FileNotFoundError as missing:
    pytest.skip(f"the browser tests need Chromium: {missing}", allow_module_level=True)

EXERCISE = "ex00"
SHOT = paths.ROOT / "build" / "screenshots" / "exercise_ex00.png"
BLOCK = re.compile(r"^[ \t]*# BEGIN SOLUTION[^\n]*\n(.*?)^[ \t]*# END SOLUTION[^\n]*\n", re.M | re.S)
STUB_BODY = re.compile(r"^[ \t]*raise NotImplementedError\(.*\)\n", re.M)


def solved(stub: str, solution: str) -> str:
    """The stub with each `raise NotImplementedError(...)` line replaced by the matching solution block's body."""
    bodies, raises = BLOCK.findall(solution), STUB_BODY.findall(stub)
    assert bodies and len(bodies) == len(raises), f"{len(bodies)} solution blocks for {len(raises)} stub bodies"
    for raised, body in zip(raises, bodies):
        stub = stub.replace(raised, body, 1)
    return stub


def check_cell(notebook: Path) -> int:
    """nbformat's index of the last code cell that calls check("ex00")."""
    cells = json.loads(notebook.read_text())["cells"]
    found = [i for i, c in enumerate(cells)
             if c["cell_type"] == "code" and f'check("{EXERCISE}")' in "".join(c["source"])]
    assert found, f"{notebook.name} has no cell that runs check(\"{EXERCISE}\")"
    return found[-1]


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.py"))}


@pytest.fixture
def repository_exercises_unchanged():
    """The repository's own exercises/ are the same after the test as before it (only the copy is edited)."""
    before = _digest(paths.EXERCISES)
    yield
    assert _digest(paths.EXERCISES) == before, "the test changed the repository's exercises/"


def test_a_learner_solves_ex00_in_the_editor_and_check_shows_every_point(tmp_path, repository_exercises_unchanged):
    stubs = sorted(paths.EXERCISES.glob(f"{EXERCISE}_*.py"))
    solution = paths.SOLUTIONS / stubs[0].name if stubs else None
    if solution is None or not solution.is_file():
        pytest.skip(f"needs exercises/{EXERCISE}_*.py and its solution in solutions/ (absent from a student release)")
    root = copy_course(tmp_path / "course")
    exercise = root / "exercises" / stubs[0].name
    answer = solved(exercise.read_text(), solution.read_text())
    assert STUB_BODY.search(answer) is None, answer
    cell = check_cell(root / FIRST_NOTEBOOK)
    notebook = Path(FIRST_NOTEBOOK).name

    seconds, clock = {}, [time.monotonic()]

    def phase(name: str) -> None:   # seconds per step, printed at the end (pytest -s) and in a failure's message
        now = time.monotonic()
        seconds[name] = round(now - clock[0], 1)
        clock[0] = now

    try:
        with jupyter_lab(root, home=tmp_path / "lab-home") as lab, chromium(CHROMIUM) as browser:
            phase("server")
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            try:
                page = context.new_page()
                page.goto(lab.start_url, wait_until="domcontentloaded", timeout=180_000)  # as `course.py lab` opens
                wait_for_idle_kernel(page, 180, FIRST_NOTEBOOK)
                assert current_tab(page) == notebook, "the start page did not open notebook 00"
                phase("open")

                run_cell(page, cell)
                stub = check_points(page, cell)
                phase("check stub")
                assert stub.possible > 0 and stub.earned == 0, f"the untouched stub: {stub}; {seconds}"
                assert stub.summary == f"{EXERCISE}: 0 / {stub.possible:g} points", stub

                open_from_file_browser(page, f"exercises/{exercise.name}")
                replace_editor_text(page, answer)
                saved = save_editor(page, exercise)
                phase("edit")
                assert saved == answer, "the file saved from the editor is not the text put into it"

                switch_to_tab(page, notebook)
                run_cell(page, cell)
                done = check_points(page, cell)
                phase("check solved")
                assert (done.earned, done.possible) == (stub.possible, stub.possible), f"after the edit: {done}"
                assert done.summary == f"{EXERCISE}: {stub.possible:g} / {stub.possible:g} points", done
                SHOT.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SHOT))
            finally:
                context.close()
    finally:
        phase("stop")
        print(f"{EXERCISE} in the browser: {sum(seconds.values()):.0f} s ({seconds})")
