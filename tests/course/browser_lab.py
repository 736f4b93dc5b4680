"""Run notebooks in a real JupyterLab, in headless Chromium driven by Playwright, and say what a learner would see.

    root = copy_course(tmp / "course")
    with jupyter_lab(root) as lab, chromium() as browser:
        run = run_notebook_in_browser(lab, browser, "notebooks/00_welcome.ipynb", "build/screenshots/00.png")
        assert not run.problems(), run.report()

`jupyter_lab` serves a course the way `python3 course.py lab` does: its root is the course's folder (so the file
browser shows exercises/ beside notebooks/), and the server's start page opens notebooks/00_welcome.ipynb
(`Lab.start_url`). `copy_course` makes the folder: a learner's copy of this checkout (course_lib, exercises,
notebooks, tests, pyproject.toml). Kernels import the served folder's own course_lib, so `paths.ROOT` there is
the copy and `check("exNN")` grades the copy's exercises/: a test may edit them, the checkout is never touched.
The server runs from this Python's environment (its lab extensions and kernel) on a free port with a token, and
keeps every folder Jupyter would write (config, data, runtime, settings, workspaces, IPython, matplotlib) inside
a temporary folder; news and update checks are off, and notebooks are not windowed, so every cell is in the
page. On exit it shuts every kernel down and kills whatever is left below the server.

`run_notebook_in_browser` opens one notebook in a fresh browser context, clicks Run > Run All Cells, waits until
every cell has run (or a timeout, or a cell waiting for input(), or a dead kernel), saves the notebook, and
returns a `NotebookRun`: what the page showed cell by cell (errors, stderr, widgets rendered or not, progress
bars, text that wraps, the check table) plus each cell's seconds from the saved notebook; and a screenshot of
the whole notebook.

What a learner does by hand, step by step (tests/course/browser/test_exercise_in_browser.py):
`open_from_file_browser` clicks through the file browser from its root, `replace_editor_text` and `save_editor`
edit a file in JupyterLab's editor (CodeMirror 6), `run_cell` runs one notebook cell, `check_points` reads the
points from its check table.

Used by tests/course/browser/. Needs the Python package playwright, not Playwright's own browsers: Debian's
chromium is used (`python3 course.py test` installs both). Nothing here imports pytest.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterator

from course_lib.timing import QUICK_VARIABLE

CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome")
# Debian's /usr/bin/chromium is a shell script that printed "[: ...: unexpected operator" here: the binary in
# /usr/lib/chromium is launched directly. Without the networking flags Chromium tries to reach Google's services.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update", "--disable-dev-shm-usage"]

CHECKOUT = Path(__file__).resolve().parents[2]   # the course's repository, where this file lies
# A learner's course folder, as copy_course makes it: what the kernels and check() need, nothing of the instructor's
# (solutions/) and no environment (.venv).
COURSE_PARTS = ("course_lib", "exercises", "notebooks", "tests", "pyproject.toml")
FIRST_NOTEBOOK = "notebooks/00_welcome.ipynb"    # what `python3 course.py lab` opens, and Lab.start_url with it

LAB_SETTINGS = {  # JupyterLab user settings, written into the temporary settings folder
    # No "receive official Jupyter news?" toast, no update check: both would reach the internet.
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    # windowingMode none: every cell in the page (the default leaves cells off screen unrendered).
    # recordTiming: each cell's start and end go into its metadata, read back from the saved notebook.
    # scrollPastEnd off: no screen of blank space under the last cell in the screenshot.
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none", "recordTiming": True, "scrollPastEnd": False},
    "@jupyterlab/extensionmanager-extension:plugin": {"enabled": False},   # it would query PyPI
}

# Output text that means a widget did not render: the text/plain fallback, or the widget manager's messages.
WIDGET_FAILURE = re.compile(r"Loading widget\.\.\.|Error displaying widget|Error rendering|"
                            r"\b(IntSlider|FloatSlider|IntProgress|FloatProgress|HBox|VBox|interactive|Dropdown|"
                            r"Button|Output)\(")
# A tqdm text bar, "42%|████      | 42/100 [00:01<00:02, 30.1it/s]": tqdm.auto fell back to text.
TQDM_TEXT = re.compile(r"\d+%\|.*\|\s*\d+/\d+|\d+it \[\d")
CONTROLS = {"slider", "dropdown", "button", "checkbox", "text", "toggle", "select", "interact"}


class LabError(RuntimeError):
    """JupyterLab did not start or stop cleanly, or a notebook never became ready; with the log's end."""


# ----------------------------------------------------------------------------------------------------- the server


@dataclass
class Lab:
    """A running JupyterLab server (yielded by `jupyter_lab`)."""

    url: str            # http://127.0.0.1:PORT/
    token: str
    root_dir: Path      # notebook paths are relative to it
    process: subprocess.Popen
    home: Path          # the temporary folder with config, data, runtime... and lab.log
    log: Path

    @property
    def start_url(self) -> str:
        """The server's own start page, token included: it redirects to FIRST_NOTEBOOK, as `course.py lab` does."""
        return f"{self.url}?token={self.token}"

    def lab_url(self, notebook: str) -> str:
        """The URL that opens `notebook` in a fresh workspace, token included."""
        return f"{self.url}lab/tree/{urllib.parse.quote(notebook)}?reset&token={self.token}"

    def api(self, method: str, path: str, timeout: float = 30) -> object:
        """Call the server's REST API, e.g. api("GET", "api/kernels"); the decoded JSON, or None."""
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        """Shut down every kernel (each may hold torch and a fork server); errors are ignored."""
        with contextlib.suppress(OSError, ValueError):
            for kernel in self.api("GET", "api/kernels") or []:
                with contextlib.suppress(OSError, ValueError):
                    self.api("DELETE", f"api/kernels/{kernel['id']}", timeout=60)

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-chars:]
        return ""


def copy_course(destination: str | os.PathLike, source: str | os.PathLike = CHECKOUT) -> Path:
    """A learner's copy of the course at `destination` (made; it must not exist): COURSE_PARTS of `source`, without
    bytecode. Served by `jupyter_lab`, its kernels run the copy's own course_lib, so `check` grades the copy."""
    destination, source = Path(destination), Path(source)
    destination.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".ipynb_checkpoints")
    for part in COURSE_PARTS:
        if (source / part).is_dir():
            shutil.copytree(source / part, destination / part, ignore=ignore)
        else:
            shutil.copy2(source / part, destination / part)
    return destination


def course_library(root: Path) -> Path:
    """The folder whose course_lib the kernels of a server on `root` import: `root` itself where it holds a
    course_lib (a course copy: its paths.ROOT is then the copy), otherwise this checkout."""
    return root if (root / "course_lib" / "__init__.py").is_file() else CHECKOUT


def lab_environment(home: Path, extra: dict[str, str] | None = None, library: Path = CHECKOUT) -> dict[str, str]:
    """The environment of a JupyterLab whose writable Jupyter folders all lie in `home`, and of its kernels:
    COURSE_QUICK=1, no bytecode written, `library`'s course_lib first on the path (before the editable install of
    the checkout), and no COURSE_TARGET from a pytest around us (check() in a kernel grades its course's exercises)."""
    env = dict(os.environ)
    for name in ("JUPYTER_PATH", "JUPYTER_CONFIG_PATH", "JUPYTER_TOKEN", "JUPYTER_PORT", "JUPYTER_PREFER_ENV_PATH",
                 "COURSE_TARGET"):
        env.pop(name, None)
    env.update({
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "config" / "lab" / "user-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "config" / "lab" / "workspaces"),
        "IPYTHONDIR": str(home / "ipython"),
        "MPLCONFIGDIR": str(home / "matplotlib"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": os.pathsep.join([str(library), *filter(None, [os.environ.get("PYTHONPATH")])]),
        QUICK_VARIABLE: "1",
        **(extra or {}),
    })
    return env


@contextlib.contextmanager
def jupyter_lab(root_dir: str | os.PathLike, home: str | os.PathLike | None = None,
                python: str | os.PathLike = sys.executable, start_timeout: float = 180,
                env: dict[str, str] | None = None) -> Iterator[Lab]:
    """Start JupyterLab on `root_dir` with `python`, as `course.py lab` does; stop it, its kernels and everything
    below it on exit.

    `root_dir` is a course's folder (copy_course): the root of the file browser, with the notebooks at
    notebooks/NN_topic.ipynb; the start page opens FIRST_NOTEBOOK where it exists. Kernels import `root_dir`'s own
    course_lib where it has one (course_library). `home` (default: a temporary folder, removed afterwards)
    receives Jupyter's folders and the log lab.log; `env` is added to the server's and the kernels' environment.
    Raises LabError if the server does not serve within `start_timeout` s, or leaves a process behind.
    """
    own_home = home is None
    home = Path(tempfile.mkdtemp(prefix="browser-lab-") if own_home else home).resolve()
    root = Path(root_dir).resolve()
    for sub in ("config", "data", "runtime", "ipython", "matplotlib"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    for plugin, values in LAB_SETTINGS.items():
        package, name = plugin.split(":")
        path = home / "config" / "lab" / "user-settings" / package / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values, indent=2))
    token = secrets.token_hex(24)
    config = {
        "ServerApp": {"ip": "127.0.0.1", "port": 0, "open_browser": False, "root_dir": str(root),
                      "allow_root": True, "terminals_enabled": False},
        "IdentityProvider": {"token": token},
        "LabApp": {"news_url": None, "check_for_updates_class": "jupyterlab.NeverCheckForUpdate"},
    }
    if (root / FIRST_NOTEBOOK).is_file():
        config["LabApp"]["default_url"] = f"/lab/tree/{FIRST_NOTEBOOK}"
    (home / "config" / "jupyter_server_config.json").write_text(json.dumps(config, indent=2))
    log = home / "lab.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen([str(python), "-m", "jupyter", "lab"], cwd=root,
                                   env=lab_environment(home, env, course_library(root)),
                                   stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    lab = None
    try:
        lab = _wait_until_serving(process, home, token, root, log, start_timeout)
        yield lab
    finally:
        if lab is not None:
            lab.shutdown_kernels()
        _stop_process_tree(process, log)
        if own_home:
            shutil.rmtree(home, ignore_errors=True)


def _wait_until_serving(process, home: Path, token: str, root: Path, log: Path, timeout: float) -> Lab:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LabError(f"JupyterLab exited with code {process.returncode}; its log ends:\n"
                           f"{log.read_text(errors='replace')[-3000:]}")
        for info_file in (home / "runtime").glob("jpserver-*.json"):   # written once it listens: the real port
            with contextlib.suppress(OSError, ValueError, KeyError):
                info = json.loads(info_file.read_text())
                lab = Lab(f"http://127.0.0.1:{info['port']}/", token, root, process, home, log)
                lab.api("GET", "api/status", timeout=5)
                return lab
        time.sleep(0.25)
    raise LabError(f"JupyterLab did not serve within {timeout:g} s; its log ends:\n"
                   f"{log.read_text(errors='replace')[-3000:]}")


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (from Linux's /proc). Kernels run in sessions of their own, so killing the
    server's process group alone would leave them, and the ranks they fork, behind."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                tree.setdefault(ppid, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in tree.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return [p for p in found if alive(p)]


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (one that has exited and waits for its parent to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _stop_process_tree(process: subprocess.Popen, log: Path, grace: float = 10) -> None:
    """SIGTERM the server's group (it stops its kernels), then SIGKILL every process still below it and its group."""
    below = set(descendants(process.pid))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)
    below |= set(descendants(process.pid))
    own_group = os.getpgrp()
    for pid in [process.pid, *below]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(pid)
            if group != own_group:
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(pid) for pid in below):
        time.sleep(0.1)
    left = [pid for pid in below if alive(pid)] + ([process.pid] if process.poll() is None else [])
    if left:
        raise LabError(f"still running after JupyterLab was stopped: {left}; see {log}")


# ---------------------------------------------------------------------------------------------------- the browser


def chromium_path() -> str:
    """Debian's Chromium binary (or another Chromium on the PATH); FileNotFoundError says how to install one."""
    for candidate in CHROMIUM_CANDIDATES:
        found = candidate if os.access(candidate, os.X_OK) else shutil.which(candidate)
        if found:
            return found
    raise FileNotFoundError("no Chromium found: run `python3 course.py test` as root (it installs Debian's), or "
                            "`sudo apt-get install -y chromium`")


@contextlib.contextmanager
def chromium(executable: str | None = None):
    """A headless Chromium driven by Playwright's sync API; it and Playwright's driver are stopped on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable or chromium_path(), headless=True,
                                             args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


# ----------------------------------------------------------------------------------------------------- a notebook


@dataclass
class Problem:
    cell: int     # nbformat's index (0 = the first cell, markdown included); -1 for the notebook as a whole
    kind: str     # error, stderr, widget, mermaid, dialog, page, save
    text: str

    def __str__(self) -> str:
        return f"{f'cell {self.cell}' if self.cell >= 0 else 'notebook'}: {self.kind}: {self.text}"


@dataclass
class NotebookRun:
    """What a learner would have seen after Run All Cells, cell by cell."""

    notebook: str
    sources: list[str] = field(default_factory=list)          # every cell's source, from the file
    code_cells: list[int] = field(default_factory=list)
    check_cell: int | None = None                             # the last code cell that calls check(...)
    timed_out: bool = False
    stopped: str = ""                                         # why waiting ended early (input(), a dead kernel)
    running: list[int] = field(default_factory=list)          # cells showing [*] at the end (running or queued)
    not_run: list[int] = field(default_factory=list)
    errors: list[Problem] = field(default_factory=list)       # error outputs (tracebacks)
    stderr: list[Problem] = field(default_factory=list)       # anything else on stderr: warnings, text bars
    widget_failures: list[Problem] = field(default_factory=list)
    other: list[Problem] = field(default_factory=list)        # dialogs, broken mermaid, an unsaved notebook...
    texts: dict[int, str] = field(default_factory=dict)           # cell -> the text of its outputs, as shown
    widgets: dict[int, list[str]] = field(default_factory=dict)   # cell -> kinds of widget views rendered there
    progress_text: list[int] = field(default_factory=list)    # cells with a tqdm *text* bar
    wrapped_text: dict[int, list[str]] = field(default_factory=dict)  # cell -> text lines the page broke
    figure_results: list[int] = field(default_factory=list)   # cells whose figure came as an Out[n]: result
    check_table: list[list[str]] = field(default_factory=list)    # the check cell's table: rows of cell texts
    check_table_wrapped: list[str] = field(default_factory=list)  # test, result, points cells on two lines
    check_table_overflows: bool = False                       # wider than the output area
    cell_seconds: dict[int, float] = field(default_factory=dict)  # from the saved notebook's recordTiming metadata
    load_per_core: float = 0.0                                # 1-minute load average / cores, after the run
    cells_in_page: int = 0
    saved: bool = False
    screenshot: Path | None = None
    phases: dict[str, float] = field(default_factory=dict)    # seconds: open, run, widgets, save, scan, screenshot...

    @property
    def seconds(self) -> float:
        return sum(self.phases.values())

    def progress_widgets(self) -> list[int]:
        return [c for c, kinds in self.widgets.items() if "progress" in kinds]

    def controls(self) -> dict[int, list[str]]:
        """Cells with an interactive ipywidgets control (slider, dropdown, button...) rendered in the page."""
        return {c: kinds for c, kinds in self.widgets.items() if set(kinds) & CONTROLS}

    def problems(self) -> list[str]:
        """What fails "runs clean", a line each: the run, errors, stderr, widgets, cells not run, no check table."""
        found = []
        if self.timed_out:
            found.append(f"notebook: timed out after {self.phases.get('run', 0):.0f} s with cells {self.running} "
                         "running or queued")
        if self.stopped:
            found.append(f"notebook: stopped waiting: {self.stopped}")
        found += [str(p) for p in self.other + self.errors + self.stderr + self.widget_failures]
        if self.not_run:
            found.append(f"cells that did not run: {self.not_run}")
        if self.check_cell is None:
            found.append("notebook: no code cell calls check(...)")
        elif not self.check_table:
            found.append(f"cell {self.check_cell}: the check cell showed no table")
        return found

    def report(self) -> str:
        lines = [f"{self.notebook}: {self.seconds:.1f} s ({', '.join(f'{k} {v:.1f}' for k, v in self.phases.items())})"
                 f", screenshot {self.screenshot}"]
        return "\n".join(lines + [f"  {line}" for line in self.problems()])

    def to_json(self) -> dict:
        data = {k: v for k, v in self.__dict__.items() if k != "sources"}
        for key in ("errors", "stderr", "widget_failures", "other"):
            data[key] = [p.__dict__ for p in getattr(self, key)]
        data["screenshot"] = str(self.screenshot) if self.screenshot else None
        data["problems"] = self.problems()
        return data


def loops_in(source: str, gpus: int = 0) -> bool:
    """Whether a cell's own code runs a loop (for, while, a comprehension), leaving out functions and classes it
    only defines, and, on a machine with no GPU, branches under `if require_gpus(...)`, which are skipped there."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        tree = ast.parse(TransformerManager().transform_cell(source))   # magics (%matplotlib) become Python
    except SyntaxError:
        return False

    def calls_require_gpus(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", "")) == "require_gpus"
                   for n in ast.walk(node))

    def visit(node: ast.AST) -> bool:
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.comprehension)):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            return False
        if isinstance(node, ast.If) and gpus == 0 and calls_require_gpus(node.test):
            return any(visit(n) for n in node.orelse)
        return any(visit(child) for child in ast.iter_child_nodes(node))

    return visit(tree)


def run_notebook_in_browser(lab: Lab, browser, notebook: str, screenshot: str | os.PathLike | None = None,
                            timeout: float = 400, open_timeout: float = 180, width: int = 1280,
                            then=None) -> NotebookRun:
    """Open `notebook` (relative to the lab's root) in a new browser context, Run All Cells, wait at most `timeout`
    seconds for them, save, look at every cell, take a screenshot of the whole notebook, and shut its kernel down.

    A timeout is a result (`timed_out`), not an exception; a notebook that never shows an idle kernel within
    `open_timeout` raises LabError. `then(page, run)` runs last, while the page and kernel are still alive."""
    path = lab.root_dir / notebook
    cells = json.loads(path.read_text())["cells"]
    run = NotebookRun(notebook, sources=["".join(c.get("source", "")) for c in cells])
    run.code_cells = [i for i, c in enumerate(cells) if c["cell_type"] == "code"]
    calls_check = [i for i in run.code_cells if re.search(r"\bcheck\(", run.sources[i])]
    run.check_cell = calls_check[-1] if calls_check else None
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    clock = [time.monotonic()]

    def phase(name: str) -> None:
        now = time.monotonic()
        run.phases[name] = round(now - clock[0], 2)
        clock[0] = now

    try:
        page.goto(lab.lab_url(notebook), wait_until="domcontentloaded", timeout=open_timeout * 1000)
        wait_for_idle_kernel(page, open_timeout, notebook)
        _fold_left_sidebar(page)
        phase("open")
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).click()
        outcome = _wait_until_done(page, timeout, run)
        phase("run")
        run.load_per_core = round(os.getloadavg()[0] / len(os.sched_getaffinity(0)), 2)
        run.timed_out = outcome == "timeout"
        run.stopped = "" if outcome in ("done", "timeout") else outcome
        if outcome == "done":
            _wait_for_widgets(page, timeout=30)
            phase("widgets")
            run.saved = _save(page, path)
            if not run.saved:
                run.other.append(Problem(-1, "save", "not saved within 30 s: errors and timings were not read back"))
            phase("save")
        _scan(page, run)
        if run.saved:
            _read_saved(path, run)
        phase("scan")
        if screenshot is not None:
            run.screenshot = _screenshot(page, Path(screenshot), width)
            phase("screenshot")
        if then is not None:
            then(page, run)
    finally:
        try:
            with contextlib.suppress(OSError, ValueError):
                for session in lab.api("GET", "api/sessions") or []:
                    if session.get("path") == notebook:
                        lab.api("DELETE", f"api/sessions/{session['id']}", timeout=60)
        finally:
            context.close()
        phase("close")
    return run


# Everything the wait needs, read from the page in one call.
_STATE = r"""() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return null;
  const kernel = document.querySelector(".jp-StatusBar-TextItem[title^='Change kernel']");
  const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  return {
    prompts: [...panel.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(p => p.innerText.trim()),
    indicator: indicator ? indicator.getAttribute('data-status') : null,
    kernel: kernel ? kernel.innerText.trim() : '',
    dialogs: [...document.querySelectorAll('.jp-Dialog')].map(d => d.innerText.replace(/\s+/g, ' ').slice(0, 400)),
    stdin: panel.querySelectorAll('.jp-Stdin-input').length,
    loading: [...panel.querySelectorAll('.jp-OutputArea-output')]
               .filter(o => /Loading widget\.\.\./.test(o.innerText)).length,
  };
}"""


def _busy(prompt: str) -> bool:
    return "*" in prompt          # running, or queued: JupyterLab shows [*] for both


def _has_run(prompt: str) -> bool:
    return re.search(r"\[\d+\]", prompt) is not None


def wait_for_idle_kernel(page, timeout: float, notebook: str) -> None:
    """Wait until the page shows `notebook`'s cells and an idle kernel; LabError on a dialog or at `timeout` s."""
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=timeout * 1000)
    deadline, state = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        state = page.evaluate(_STATE)
        if state and state["dialogs"]:
            raise LabError(f"{notebook}: a dialog appeared while opening: {state['dialogs']}")
        if state and state["kernel"].endswith("| Idle") and state["indicator"] == "idle":
            return
        time.sleep(0.25)
    raise LabError(f"{notebook}: the kernel was not idle within {timeout:g} s (last seen: {state})")


def _fold_left_sidebar(page) -> None:
    """Fold the file browser away, so the notebook has the page's width (as in the screenshot)."""
    tab = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
    if tab.count():
        tab.first.click()


def _wait_until_done(page, timeout: float, run: NotebookRun) -> str:
    """"done" once no prompt shows [*], the execution indicator is idle and the kernel says Idle, twice in a row
    half a second apart; "timeout"; or why waiting longer is pointless (input(), a dead kernel)."""
    deadline, started, quiet = time.monotonic() + timeout, False, 0
    state = None
    while time.monotonic() < deadline:
        state = page.evaluate(_STATE)
        if state is None:
            time.sleep(0.5)
            continue
        if state["stdin"]:
            return "a cell waits for input(); nobody can answer it in a test"
        for dialog in state["dialogs"]:
            run.other.append(Problem(-1, "dialog", dialog))
            if "died" in dialog or "Restarting" in dialog:
                return "the kernel died"
            page.keyboard.press("Escape")
        busy = any(_busy(p) for p in state["prompts"]) or state["indicator"] == "busy"
        started = started or busy or any(_has_run(p) for p in state["prompts"]) or not state["prompts"]
        quiet = quiet + 1 if started and not busy and state["indicator"] == "idle" \
            and state["kernel"].endswith("| Idle") else 0
        if quiet >= 2:
            return "done"
        time.sleep(0.5)
    run.running = [i for i, p in zip(run.code_cells, (state or {}).get("prompts", [])) if _busy(p)]
    return "timeout"


def _wait_for_widgets(page, timeout: float) -> None:
    """Widget views render after their cell has finished: give "Loading widget..." a moment to go."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (page.evaluate(_STATE) or {}).get("loading"):
        time.sleep(0.25)
    time.sleep(0.5)   # let the last views (sliders, progress bars) lay out


def _save(page, path: Path, timeout: float = 30) -> bool:
    """Ctrl+S in command mode; True once the file on disk changed."""
    before = path.stat().st_mtime_ns
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").first.click(position={"x": 5, "y": 5})
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.stat().st_mtime_ns != before:
            time.sleep(0.5)   # the server may still be writing
            return True
        time.sleep(0.25)
    return False


# One pass over the page: per cell, its prompt and outputs; per output, its mime type, text, widget views,
# whether its text wraps (more lines on screen than in the text), and its tables with the cells that wrap.
_SCAN = r"""() => {
  const lines = el => {   // how many lines an element's text takes on screen: clusters of its text's boxes
    const centres = [];
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (!node.textContent.trim()) continue;
      const range = document.createRange();
      range.selectNodeContents(node);
      for (const r of range.getClientRects()) if (r.width > 0) centres.push(r.top + r.height / 2);
    }
    centres.sort((a, b) => a - b);
    return centres.filter((c, i) => i === 0 || c - centres[i - 1] > 6).length;
  };
  const cells = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')];
  return cells.map(cell => ({
    kind: cell.classList.contains('jp-CodeCell') ? 'code' : cell.classList.contains('jp-MarkdownCell') ? 'markdown'
          : 'raw',
    prompt: (cell.querySelector('.jp-InputArea-prompt') || {innerText: ''}).innerText.trim(),
    mermaidWarnings: [...cell.querySelectorAll('.jp-RenderedMermaid.jp-mod-warning')].map(m => m.innerText.slice(0, 300)),
    outputs: [...cell.querySelectorAll('.jp-OutputArea-output')].map(o => {
      const pre = o.querySelector('pre');
      const text = o.innerText || '';
      return {
        mime: o.getAttribute('data-mime-type') || '',
        text: text.slice(0, 4000),
        wraps: pre ? lines(pre) > pre.innerText.split('\n').filter(l => l.trim()).length : false,
        widgets: [...o.querySelectorAll('.jupyter-widgets')].map(w => w.className),
        stdin: o.querySelectorAll('.jp-Stdin, .jp-Stdin-input').length,
        tables: [...o.querySelectorAll('table')].map(t => ({
          rows: [...t.querySelectorAll('tr')].map(r => [...r.children].map(c => c.innerText.trim())),
          wrapped: [...t.querySelectorAll('tr')].slice(1)
                     .flatMap(r => [...r.children].slice(0, 3)).filter(c => lines(c) > 1).map(c => c.innerText),
          overflows: t.scrollWidth > o.clientWidth + 1,
        })),
      };
    }),
  }));
}"""


def _widget_kind(class_name: str) -> str | None:
    classes = class_name.split()
    for marker, kind in (("widget-slider", "slider"), ("widget-hprogress", "progress"),
                         ("widget-vprogress", "progress"), ("widget-interact", "interact"),
                         ("widget-dropdown", "dropdown"), ("widget-button", "button"), ("widget-toggle", "toggle"),
                         ("widget-checkbox", "checkbox"), ("widget-select", "select"), ("widget-text", "text"),
                         ("widget-output", "output")):
        if any(c.startswith(marker) for c in classes):
            return kind
    return None


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + " …"


def _scan(page, run: NotebookRun) -> None:
    cells = page.evaluate(_SCAN)
    run.cells_in_page = len(cells)
    if len(cells) != len(run.sources):
        run.other.append(Problem(-1, "page", f"the page showed {len(cells)} cells, the file has {len(run.sources)} "
                                 "(windowing on? the checks saw only part of it)"))
    for i, cell in enumerate(cells):
        for warning in cell["mermaidWarnings"]:
            run.other.append(Problem(i, "mermaid", f"the diagram did not render: {_short(warning)}"))
        if cell["kind"] != "code":
            continue
        if not _has_run(cell["prompt"]) and i not in run.not_run:
            run.not_run.append(i)
        for out in cell["outputs"]:
            text = out["text"].strip()
            run.texts[i] = f"{run.texts[i]}\n{text}" if i in run.texts else text
            kinds = [k for k in map(_widget_kind, out["widgets"]) if k]
            for kind in kinds:
                if kind not in run.widgets.setdefault(i, []):
                    run.widgets[i].append(kind)
            if out["stdin"]:
                run.other.append(Problem(i, "stdin", "waits for input()"))
            if out["mime"] == "application/vnd.jupyter.stderr":   # tracebacks and stderr look the same here
                if TQDM_TEXT.search(text):
                    run.progress_text.append(i)
                    run.stderr.append(Problem(i, "stderr", f"a text progress bar (use tqdm.auto): {_short(text)}"))
                else:
                    run.stderr.append(Problem(i, "stderr", _short(text)))
            elif not kinds and WIDGET_FAILURE.search(text):
                run.widget_failures.append(Problem(i, "widget", f"shown as text, not rendered: {_short(text)}"))
            if out["wraps"]:
                long_lines = sorted((line for line in text.splitlines() if len(line) > 90), key=len, reverse=True)
                run.wrapped_text.setdefault(i, []).extend(long_lines[:3] or [_short(text, 120)])
            if i == run.check_cell:
                for table in out["tables"]:
                    if len(table["rows"]) > 1:
                        run.check_table = table["rows"]
                        run.check_table_wrapped = table["wrapped"]
                        run.check_table_overflows = table["overflows"]


def _read_saved(path: Path, run: NotebookRun) -> None:
    """The saved notebook tells what the page cannot: an error from a stderr stream, cells never executed, each
    cell's seconds (recordTiming), and figures sent as a result (an Out[n]: prompt beside a picture)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    errors = {p.cell for p in run.errors}
    for i, cell in enumerate(saved.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                if i not in errors:
                    run.errors.append(Problem(i, "error", f"{output.get('ename')}: {_short(output.get('evalue', ''))}"))
                    errors.add(i)
            elif output.get("output_type") == "execute_result" and "image/png" in output.get("data", {}):
                run.figure_results.append(i)
        if cell.get("execution_count") is None and i not in run.not_run:
            run.not_run.append(i)
        timing = cell.get("metadata", {}).get("execution", {})
        with contextlib.suppress(KeyError, ValueError):
            start = datetime.fromisoformat(timing["iopub.execute_input"].replace("Z", "+00:00"))
            end = datetime.fromisoformat(timing["shell.execute_reply"].replace("Z", "+00:00"))
            run.cell_seconds[i] = (end - start).total_seconds()
    run.stderr = [p for p in run.stderr if p.cell not in errors]   # the page showed those tracebacks as stderr
    run.not_run.sort()


def _screenshot(page, path: Path, width: int, max_height: int = 30000) -> Path:
    """The whole notebook in one PNG: the page is made as tall as the notebook (it scrolls inside a panel, so
    Playwright's full_page would capture one screen), then shot, then made small again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scroller = "document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer')"
    extra = page.evaluate(f"() => {{ const s = {scroller}; return s ? s.scrollHeight - s.clientHeight : 0; }}")
    page.set_viewport_size({"width": width, "height": min(900 + int(extra) + 40, max_height)})
    time.sleep(1.0)   # let lumino lay the panels out at the new size
    page.evaluate(f"() => {{ const s = {scroller}; if (s) s.scrollTop = 0; }}")
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": width, "height": 900})
    return path


def move_slider(page, cell: int, presses: int = 3, timeout: float = 30) -> tuple[str, str]:
    """Press the right arrow `presses` times on the first slider of notebook cell `cell`; that cell's output text
    before, and after it changed (or at the timeout): proof that the kernel answers the widget."""
    box = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(cell)
    outputs = box.locator(".jp-Cell-outputArea")
    before = outputs.inner_text()
    handle = box.locator(".widget-slider .noUi-handle").first    # noUiSlider's handle takes the keyboard
    handle.focus()
    for _ in range(presses):
        handle.press("ArrowRight")
    deadline, after = time.monotonic() + timeout, before
    while time.monotonic() < deadline and after == before:
        time.sleep(0.25)
        after = outputs.inner_text()
    time.sleep(0.5)
    return before, outputs.inner_text()


# ------------------------------------------------------------------------------------ what a learner does by hand


@dataclass
class CheckTable:
    """The points a check cell's table showed: its heading ("ex00: 0 / 7 points"), its rows, and the points
    column added up."""

    summary: str
    rows: list[list[str]]
    earned: float
    possible: float


_NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"
_POINTS = re.compile(r"(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)")


def current_tab(page) -> str:
    """The label of the main area's current tab, e.g. "ex00_warmup.py"."""
    return page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel").first.inner_text()


def switch_to_tab(page, label: str, timeout: float = 30) -> None:
    """Click the main area's tab labelled `label` and wait until it is the current one."""
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab",
                       has=page.locator(".lm-TabBar-tabLabel", has_text=re.compile(f"^{re.escape(label)}$")))
    tab.click(timeout=timeout * 1000)
    page.wait_for_selector(f".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current:has-text('{label}')",
                           timeout=timeout * 1000)


def open_from_file_browser(page, path: str, timeout: float = 60) -> None:
    """Open `path` ("exercises/ex00_warmup.py", relative to the server's root) as a learner does: show the file
    browser (the folder icon on the left), click the root of its breadcrumbs (the folder icon above the list),
    then double-click each folder and the file in turn; return once the file's tab is the current one."""
    ms = timeout * 1000
    tab = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab[data-id='filebrowser']")
    if "lm-mod-current" not in (tab.get_attribute("class", timeout=ms) or ""):
        tab.click(timeout=ms)
    panel = page.locator("#filebrowser")
    crumbs = panel.locator(".jp-BreadCrumbs").element_handle(timeout=ms)

    def wait_for_folder(folder: str) -> None:   # the breadcrumbs name the folder once its listing is in
        page.wait_for_function("""([crumbs, folder]) => {
            const items = crumbs.querySelectorAll('.jp-BreadCrumbs-item');
            return (items.length ? items[items.length - 1].dataset.path : '') === folder;
        }""", arg=[crumbs, folder], timeout=ms)

    panel.locator(".jp-BreadCrumbs-home").click(timeout=ms)
    wait_for_folder("")
    *folders, name = path.split("/")
    for depth, part in enumerate([*folders, name]):
        item = panel.locator(".jp-DirListing-item",
                             has=page.locator(".jp-DirListing-itemText", has_text=re.compile(f"^{re.escape(part)}$")))
        item.dblclick(timeout=ms)
        if depth < len(folders):
            wait_for_folder("/".join(folders[:depth + 1]))
    page.wait_for_selector(f".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current:has-text('{name}')", timeout=ms)


def replace_editor_text(page, text: str, timeout: float = 30) -> None:
    """In the current file editor (CodeMirror 6): click into the text, select all (Ctrl+A) and put `text` in its
    place as one input, as a paste would (typing key by key would trip the editor's auto-indent)."""
    content = page.locator(".jp-FileEditor:visible .cm-content")
    content.click(timeout=timeout * 1000)
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(text)


def save_editor(page, path: Path, timeout: float = 30) -> str:
    """Ctrl+S in the current editor; wait until its tab no longer shows unsaved changes and `path` on disk changed;
    the file's text then (LabError if that does not happen within `timeout` s)."""
    before = path.stat().st_mtime_ns
    page.locator(".jp-FileEditor:visible .cm-content").click()
    page.keyboard.press("Control+s")
    page.wait_for_selector(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current:not(.jp-mod-dirty)",
                           timeout=timeout * 1000)
    deadline = time.monotonic() + timeout
    while path.stat().st_mtime_ns == before:
        if time.monotonic() > deadline:
            raise LabError(f"{path.name} was not saved within {timeout:g} s")
        time.sleep(0.1)
    return path.read_text()


def run_cell(page, cell: int, timeout: float = 300) -> str:
    """Click into notebook cell `cell` (nbformat's index) and press Shift+Enter; wait until its prompt shows a new
    execution count ([*] -> [n]). The prompt it ended with."""
    box = page.locator(f"{_NOTEBOOK} .jp-Notebook .jp-Cell").nth(cell)
    prompt = box.locator(".jp-InputArea-prompt")
    before = prompt.inner_text().strip()
    box.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    page.wait_for_function(r"""([prompt, before]) => {
        const now = prompt.innerText.trim();
        return /\[\d+\]/.test(now) && now !== before;
    }""", arg=[prompt.element_handle(), before], timeout=timeout * 1000, polling=250)
    return prompt.inner_text().strip()


def check_points(page, cell: int) -> CheckTable:
    """What notebook cell `cell`'s check table shows: its bold heading, its rows (header first), the points
    column ("earned / possible" per row) added up. LabError, with the cell's output, where there is no table."""
    box = page.locator(f"{_NOTEBOOK} .jp-Notebook .jp-Cell").nth(cell)
    found = box.evaluate(r"""cell => {
        const output = [...cell.querySelectorAll('.jp-OutputArea-output')].find(o => o.querySelector('table'));
        if (!output) return {text: cell.querySelector('.jp-Cell-outputArea')?.innerText || ''};
        return {summary: (output.querySelector('b') || {innerText: ''}).innerText.trim(),
                rows: [...output.querySelectorAll('table tr')].map(r => [...r.children].map(c => c.innerText.trim()))};
    }""")
    if "rows" not in found:
        raise LabError(f"cell {cell} shows no check table; its output: {_short(found['text'], 1500)}")
    header, *rows = found["rows"]
    column = header.index("points")
    earned = possible = 0.0
    for row in rows:
        match = _POINTS.fullmatch(row[column]) if len(row) > column else None
        if match:      # "–" for a test not graded here
            earned, possible = earned + float(match[1]), possible + float(match[2])
    return CheckTable(found["summary"], found["rows"], earned, possible)
