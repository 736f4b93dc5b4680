"""Every lesson in a real JupyterLab, in headless Chromium: it runs clean, and it looks like a polished course.

    python3 course.py test -m browser          only these tests
    python3 course.py test -m "not browser"    everything but these

One JupyterLab server (from this environment, on a free port, with its Jupyter folders in a temporary folder)
and one Chromium serve every test here. The server serves a copy of the course as `python3 course.py lab` serves
the course (browser_lab.copy_course: its root is the course's folder, its kernels run the copy's course_lib, so
each lesson's check cell grades the copy's exercises/). Each lesson (notebooks/NN_*.ipynb, found by a glob) is
opened at notebooks/NN_topic.ipynb, run with Run > Run All Cells, saved, looked at cell by cell and photographed:
build/screenshots/NN_topic.png, with what was seen in NN_topic.json beside it. Kernels run with COURSE_QUICK=1
(course_lib.timing.quick), so a lesson may shrink its sizes, running the same code.

What fails a lesson, beside an error: anything on stderr (warnings, tqdm's text bar), a cell that did not run,
a widget shown as text, a mermaid diagram that did not render, no check table, a check table that repeats a hint
or breaks its result column, text lines the page has to break, a figure shown as an `Out[n]:` result, a loop of
more than SLOW_LOOP_SECONDS without a tqdm.auto bar, and, from lesson 02 on, no interactive ipywidgets control.
The demo notebooks at the top, written at test time, prove that each of these checks fails when it should.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_lib import paths

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

try:
    import playwright  # noqa: F401
except ImportError:
    pytest.skip("the browser tests need the Python package playwright: `python3 course.py test` installs it "
                "(or: pip install -e '.[browser]')", allow_module_level=True)

import browser_lab  # noqa: E402
from browser_lab import (chromium, copy_course, jupyter_lab, loops_in, move_slider,  # noqa: E402
                         run_notebook_in_browser)

try:
    CHROMIUM = browser_lab.chromium_path()
except FileNotFoundError as missing:
    pytest.skip(f"the browser tests need Chromium: {missing}", allow_module_level=True)

LESSONS = sorted(paths.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
SHOTS = paths.ROOT / "build" / "screenshots"
LESSON_TIMEOUT = 400          # seconds for one lesson's Run All on a busy 2-core machine; ~2 min is usual
# A loop that runs longer than this on an idle machine shows a tqdm.auto bar. What the test sees: each cell's
# wall-clock seconds (recordTiming), and whether the cell's own code loops (a for, a while or a comprehension,
# outside the functions it only defines, and outside `if require_gpus(...)` branches where there is no GPU). A
# cell that loops and took longer than SLOW_LOOP_SECONDS x max(1, load average per core during the run) must show
# a bar: the same cell took 4.7 s and 18.3 s in two runs here as other jobs came and went, and the scaling stands
# in for the idle machine a learner has. What it cannot see: which part of a slow cell is the loop (a cell slow
# for another reason that also loops is flagged), and loops inside a course_lib call. Give every loop that can
# come near this a bar.
SLOW_LOOP_SECONDS = 5.0
LONG_HINT = 40                # characters: a message this long in two rows of the check table is one too many


def _gpus() -> int:
    from course_lib.devices import cuda_gpu_count

    return cuda_gpu_count()


# ------------------------------------------------------------------------------ what the lesson tests check


def table_problems(run: browser_lab.NotebookRun) -> list[str]:
    """The check table: present, each long message shown once, test, result and points on one line, not too wide."""
    if not run.check_table:
        return [f"cell {run.check_cell}: no check table"]
    found = []
    texts = Counter(text for row in run.check_table[1:] for text in row if len(text) >= LONG_HINT)
    for text, count in texts.items():
        if count > 1:
            found.append(f"the same message in {count} rows: {text[:100]}")
    if run.check_table_wrapped:
        found.append(f"a test, result or points broken over two lines: {run.check_table_wrapped}")
    if run.check_table_overflows:
        found.append("the table is wider than the notebook")
    return found


def slow_loops_without_a_bar(run: browser_lab.NotebookRun, seconds: float = SLOW_LOOP_SECONDS,
                             gpus: int = 0, load: float | None = None) -> dict[int, str]:
    """Cells whose own code loops and which took longer than `seconds` x max(1, load per core; the run's unless
    given), without a tqdm.auto widget: {cell: "12.3 s"}."""
    limit = seconds * max(1.0, run.load_per_core if load is None else load)
    bars = run.progress_widgets()
    return {cell: f"{spent:.1f} s" for cell, spent in sorted(run.cell_seconds.items())
            if spent > limit and cell not in bars and cell != run.check_cell and loops_in(run.sources[cell], gpus)}


def output_problems(run: browser_lab.NotebookRun) -> list[str]:
    """Text the page breaks mid-line (shorten it or fold it at ~100 characters), figures shown as Out[n]: results."""
    found = [f"cell {cell}: a line too long for the page, broken mid-word: {lines[0][:140]!r}"
             for cell, lines in sorted(run.wrapped_text.items())]
    found += [f"cell {cell}: a figure shown as an Out[n]: result (end the line with ';' or show it)"
              for cell in run.figure_results]
    return found


# ------------------------------------------------------------------------------ one server, one browser


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """What the server serves: a copy of the course, as a learner has it (the lessons are saved after running, and
    their check cells grade its exercises/), with the demo notebooks in demos/ beside notebooks/."""
    root = copy_course(tmp_path_factory.mktemp("copy") / "course")
    assert sorted(p.name for p in (root / "notebooks").glob("[0-9][0-9]_*.ipynb")) == [p.name for p in LESSONS]
    (root / "demos").mkdir()
    for name, cells in DEMOS.items():
        notebook = new_notebook(cells=cells, metadata={"kernelspec": {"display_name": "Python 3 (ipykernel)",
                                                                      "language": "python", "name": "python3"}})
        nbformat.write(notebook, root / "demos" / f"{name}.ipynb")
    return root


@pytest.fixture(scope="module")
def lab(course, tmp_path_factory):
    with jupyter_lab(course, home=tmp_path_factory.mktemp("lab-home")) as server:
        yield server


@pytest.fixture(scope="module")
def browser():
    with chromium(CHROMIUM) as chromium_browser:
        yield chromium_browser


_runs: dict[str, browser_lab.NotebookRun] = {}
_failed: dict[str, str] = {}


@pytest.fixture
def lesson(request, lab, browser) -> browser_lab.NotebookRun:
    """The lesson's run, made once and shared by the tests below; its screenshot and JSON go to build/screenshots/."""
    path: Path = request.param
    if path.name in _failed:
        pytest.fail(f"{path.name} could not be run in the browser: {_failed[path.name]}")
    if path.name not in _runs:
        try:
            run = run_notebook_in_browser(lab, browser, f"notebooks/{path.name}", SHOTS / f"{path.stem}.png",
                                          timeout=LESSON_TIMEOUT)
        except Exception as error:   # once, not once per test
            _failed[path.name] = f"{type(error).__name__}: {error}"
            raise
        _runs[path.name] = run
        (SHOTS / f"{path.stem}.json").write_text(json.dumps(run.to_json(), indent=1, default=str))
        request.config.course_browser_runs = {**getattr(request.config, "course_browser_runs", {}), path.name: run}
    return _runs[path.name]


def _demo(lab, browser, name: str, timeout: float = 60, then=None) -> browser_lab.NotebookRun:
    return run_notebook_in_browser(lab, browser, f"demos/{name}.ipynb", SHOTS / "demos" / f"{name}.png",
                                   timeout=timeout, then=then)


# ------------------------------------------------------------------------------ the demos: the checks work

FAKE_CHECK = '''from course_lib.check import CheckResult
from course_lib.grading.results import TestOutcome

HINT = "not implemented yet (hint: in each step isend() to the right and recv() from the left, then add)"


def check(exercise):   # stands in for course_lib.check.check: the same table, without running pytest
    tests = [TestOutcome(f"tests/test_{exercise}_demo.py::{name}", 2, outcome, message) for name, outcome, message in
             [("test_ring[2]", "failed", HINT), ("test_ring[3]", "failed", HINT), ("test_ring_rejects", "failed", HINT),
              ("test_other", "passed", "")]]
    display(CheckResult(exercise, tests))


check("ex99")'''

BAD_TABLE = '''from IPython.display import HTML

HINT = "not implemented yet (hint: in each step isend() to the right and recv() from the left, then add)"


def check(exercise):   # a table as it should not look: the hint in every row, the result broken in two
    row = f"<tr><td>test_ring</td><td style='width:1px'>✘ FAILED</td><td>0 / 2</td><td>{HINT} {HINT}</td></tr>"
    display(HTML(f"<b>{exercise}: 0 / 6 points</b><table><tr><th>test</th><th>result</th><th>points</th>"
                 f"<th>message</th></tr>{row * 3}</table>"))


check("ex98")'''

DEMOS = {
    "fine": [   # everything a lesson should be: passes every check
        new_markdown_cell("# A fine demo\n\n```mermaid\nflowchart LR\n    A[edit] --> B[check]\n```"),
        new_code_cell("import os\nimport course_lib\n\nprint(os.environ.get('COURSE_QUICK'), course_lib.__file__)"),
        new_code_cell("import time\nfrom tqdm.auto import tqdm\n\nfor step in tqdm(range(20), desc='steps'):\n"
                      "    time.sleep(0.05)"),
        new_code_cell("from ipywidgets import IntSlider, interact\n\n\n@interact(n=IntSlider(min=1, max=10, value=3))\n"
                      "def square(n):\n    print(f'{n} squared is {n * n}')"),
        new_code_cell("from course_lib.diagrams import collective_picture\n\ncollective_picture('all_reduce')"),
        new_code_cell(FAKE_CHECK),
    ],
    "untidy": [   # no error, but everything else a learner should not see
        new_markdown_cell("# An untidy demo\n\n```mermaid\nflowchart LR\n    A[edit] -->\n```"),
        new_code_cell("import warnings\n\nwarnings.warn('something looks off')"),
        new_code_cell("import time\nfrom tqdm import tqdm   # the text bar\n\nfor step in tqdm(range(5)):\n"
                      "    time.sleep(0.02)"),
        new_code_cell("display({'application/vnd.jupyter.widget-view+json': {'model_id': 'none', 'version_major': 2,"
                      " 'version_minor': 0}, 'text/plain': 'IntSlider(value=3)'}, raw=True)"),
        new_code_cell("for step in range(6):\n    time.sleep(0.25)"),
        new_code_cell("print('a line far too long for the page: ' + 'word ' * 40)"),
        new_code_cell("%matplotlib inline\n"
                      "from matplotlib.figure import Figure\n\nfigure = Figure(figsize=(3, 2))\n"
                      "figure.subplots().plot([1, 2])\nfigure"),
        new_code_cell(BAD_TABLE),
    ],
    "broken": [
        new_code_cell("print('fine so far')"),
        new_code_cell("1 / 0"),
        new_code_cell("print('never runs: Run All stops at the error')"),
        new_code_cell(FAKE_CHECK),
    ],
    "hangs": [
        new_code_cell("print('fine so far')"),
        new_code_cell("import time\n\ntime.sleep(600)"),
        new_code_cell("print('queued behind the sleep')"),
    ],
    "asks": [
        new_code_cell("name = input('your name? ')"),
        new_code_cell("print('hello', name)"),
    ],
}


def test_a_fine_notebook_passes_every_check_and_its_slider_reaches_the_kernel(lab, browser):
    moved = {}

    def slide(page, run):
        moved["before"], moved["after"] = move_slider(page, 3)
        moved["toasts"] = page.locator(".Toastify__toast").all_inner_texts()

    run = _demo(lab, browser, "fine", then=slide)
    assert not run.problems(), run.report()
    quick, library = run.texts[1].split()
    assert quick == "1" and Path(library).is_relative_to(lab.root_dir), "kernels: COURSE_QUICK=1, the copy's course_lib"
    assert run.progress_widgets() == [2] and not run.progress_text
    assert list(run.controls()) == [3]
    assert "3 squared is 9" in moved["before"] and "6 squared is 36" in moved["after"], moved
    assert not moved["toasts"], f"a notification appeared (news?): {moved['toasts']}"
    assert not table_problems(run), table_problems(run)
    assert [row[0] for row in run.check_table[1:]] == ["test_ring [2, 3]", "test_ring_rejects", "test_other"]
    assert not slow_loops_without_a_bar(run, seconds=0.1, load=0) and not output_problems(run)


def test_an_untidy_notebook_fails_each_check(lab, browser):
    run = _demo(lab, browser, "untidy")
    assert not run.errors and not run.not_run and run.check_table
    assert [p.kind for p in run.other] == ["mermaid"] and run.other[0].cell == 0
    assert [p.cell for p in run.stderr] == [1, 2] and "UserWarning: something looks off" in run.stderr[0].text
    assert run.progress_text == [2]
    assert [p.cell for p in run.widget_failures] == [3]
    assert list(slow_loops_without_a_bar(run, seconds=1.0, load=0)) == [4]
    assert list(run.wrapped_text) == [5] and run.figure_results == [6]
    assert len(output_problems(run)) == 2
    problems = table_problems(run)
    assert any("the same message in 3 rows" in p for p in problems), problems
    assert any("broken over two lines" in p for p in problems), problems


def test_an_error_stops_the_run_and_the_cells_after_it_did_not_run(lab, browser):
    run = _demo(lab, browser, "broken")
    assert [p.cell for p in run.errors] == [1] and "ZeroDivisionError" in run.errors[0].text
    assert not run.stderr, "the traceback counts as an error, not as stderr"
    assert run.not_run == [2, 3] and not run.check_table
    assert any("showed no table" in p for p in run.problems())


def test_a_hang_times_out_and_its_kernel_is_stopped(lab, browser):
    run = _demo(lab, browser, "hangs", timeout=8)
    assert run.timed_out and run.running == [1, 2] and run.not_run == [1, 2], run.report()
    deadline = time.monotonic() + 30
    while (kernels := [p for p in browser_lab.descendants(lab.process.pid)
                       if b"ipykernel" in Path(f"/proc/{p}/cmdline").read_bytes()]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not kernels, "the kernel busy in time.sleep(600) was not shut down"


def test_a_cell_waiting_for_input_stops_the_wait_at_once(lab, browser):
    run = _demo(lab, browser, "asks", timeout=60)
    assert "input()" in run.stopped and run.not_run == [0, 1] and run.phases["run"] < 30


def test_loops_are_found_in_a_cells_own_code_only():
    assert loops_in("for x in range(3):\n    pass") and loops_in("%matplotlib inline\nwhile False:\n    pass")
    assert loops_in("print([x * x for x in range(3)])") and loops_in("if True:\n    for x in y:\n        pass")
    assert not loops_in("def f():\n    for x in range(3):\n        pass\n\n\nlaunch(f, 2)")
    assert not loops_in("class A:\n    def f(self):\n        while True:\n            pass")
    gpu_cell = "if require_gpus(1, 'time it'):\n    for flag in (False, True):\n        pass"
    assert not loops_in(gpu_cell, gpus=0) and loops_in(gpu_cell, gpus=1)
    assert loops_in(gpu_cell + "\nelse:\n    for x in y:\n        pass", gpus=0)


def test_the_slow_loop_limit_grows_with_the_machines_load():
    run = browser_lab.NotebookRun("x.ipynb", sources=["for i in x:\n    pass", "check('ex00')"], check_cell=1,
                                  cell_seconds={0: 12.0, 1: 60.0}, load_per_core=2.0)
    assert slow_loops_without_a_bar(run) == {0: "12.0 s"}               # over 5 s x 2
    run.load_per_core = 3.0
    assert slow_loops_without_a_bar(run) == {}                         # under 5 s x 3
    run.widgets[0] = ["progress"]
    assert slow_loops_without_a_bar(run, load=0) == {}                 # a bar: fine however slow


# ------------------------------------------------------------------------------ the lessons


def _ids(path: Path) -> str:
    return path.stem


@pytest.mark.parametrize("lesson", LESSONS, ids=_ids, indirect=True)
def test_lesson_runs_clean(lesson):
    """No error, nothing on stderr, every cell ran, every widget rendered, and the check cell showed its table."""
    assert not lesson.problems(), lesson.report()


@pytest.mark.parametrize("lesson", LESSONS, ids=_ids, indirect=True)
def test_lesson_check_table_is_readable(lesson):
    assert not table_problems(lesson), f"{lesson.notebook}: " + "; ".join(table_problems(lesson))


@pytest.mark.parametrize("lesson", LESSONS, ids=_ids, indirect=True)
def test_lesson_slow_loops_show_a_progress_bar(lesson):
    missing = slow_loops_without_a_bar(lesson, gpus=_gpus())
    limit = SLOW_LOOP_SECONDS * max(1.0, lesson.load_per_core)
    assert not missing, (f"{lesson.notebook}: cells that loop for more than {limit:.1f} s ({SLOW_LOOP_SECONDS:g} s "
                         f"x load {lesson.load_per_core:g} per core) without a tqdm.auto bar (cell: seconds): {missing}")


@pytest.mark.parametrize("lesson", LESSONS, ids=_ids, indirect=True)
def test_lesson_output_fits_the_page(lesson):
    assert not output_problems(lesson), f"{lesson.notebook}:\n" + "\n".join(output_problems(lesson))


@pytest.mark.parametrize("lesson", [p for p in LESSONS if int(p.name[:2]) >= 2], ids=_ids, indirect=True)
def test_lesson_has_an_interactive_control(lesson):
    """From lesson 02 on, at least one ipywidgets control (a slider, a dropdown...) to explore a parameter."""
    assert lesson.controls(), f"{lesson.notebook}: no ipywidgets control rendered (every lesson from 02 on has one)"
