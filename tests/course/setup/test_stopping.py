"""Ctrl-C or SIGTERM stops every command of the course within STOP_WITHIN (10) seconds, and leaves nothing running:
no pytest worker, fork server or rank, no JupyterLab, kernel or browser, no worker of the self-checks.

Each test starts the real command as a user's shell would (tests/course/signal_stop.py), waits until it is provably
mid-run (ranks exist, a kernel runs, ...), signals the command's process alone, and lists what is left. The wait
for mid-run is generous (a loaded machine takes long to import torch and start fork servers); the seconds after the
signal are the requirement. The learner's exercise used here hangs (a function that sleeps), so each run is
mid-run for as long as the test needs. The grader and Gradescope's run_autograder are stopped in
tests/course/instructor/test_stopping_grader.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from course_lib.paths import ROOT
from signal_stop import STOP_WITHIN, Stopping, below, is_rank

COURSE_PY = [sys.executable, str(ROOT / "course.py")]
# This environment counts as the active one: course.py creates nothing and installs nothing.
ENV = {**os.environ, "VIRTUAL_ENV": sys.prefix}
SIGNALS = [pytest.param(signal.SIGINT, id="SIGINT"), pytest.param(signal.SIGTERM, id="SIGTERM")]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")

HUNG = '''

import time


def shard_range(num_items, world_size, rank):
    time.sleep(3600)  # a learner's function that never returns


def all_reduce_mean(tensor):
    time.sleep(3600)
'''


def _hung_exercises(tmp_path: Path) -> Path:
    """A learner's folder whose ex00 functions never return: its graded tests run until they are stopped."""
    folder = tmp_path / "hung"
    folder.mkdir()
    (folder / "ex00_warmup.py").write_text((ROOT / "exercises" / "ex00_warmup.py").read_text() + HUNG)
    return folder


def _ranks(tree) -> list:
    return [p for p in tree if is_rank(p, tree)]


def _assert_stopped(run: Stopping, sig: int, returncode: int | None = None, spare=lambda proc: False):
    """Signal the command; it exits within STOP_WITHIN s, with 128 + the signal's number (course.py's own exit code
    when it was stopped) or `returncode`, and leaves nothing running (but what `spare` names)."""
    stopped = run.stop(sig, spare=spare)
    print(stopped.report())
    assert stopped.seconds <= STOP_WITHIN and not stopped.left, stopped.report()
    assert stopped.returncode == (128 + sig if returncode is None else returncode), stopped.report()
    return stopped


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig, through", [
    pytest.param(signal.SIGINT, "course.py", id="SIGINT"), pytest.param(signal.SIGTERM, "course.py", id="SIGTERM"),
    # pytest itself, as an IDE or a CI runner stops it: the course's plugin alone, nothing of course.py's
    pytest.param(signal.SIGTERM, "pytest", id="SIGTERM-to-pytest-itself")])
def test_pytest_with_xdist_workers_stops_with_its_ranks(tmp_path, sig, through):
    """`course.py pytest -n 2` (as `course.py test`'s last step runs the suite): both workers in a hung test. And
    pytest run without course.py, signalled alone: its controller passes the signal on to its workers."""
    target = _hung_exercises(tmp_path)
    start = COURSE_PY + ["pytest"] if through == "course.py" else [sys.executable, "-m", "pytest"]
    with Stopping([*start, "tests/test_ex00_warmup.py", "-n", "2", "--target", str(target)], tmp_path / "log",
                  cwd=ROOT, env=ENV) as run:
        run.wait_until(lambda tree: len({p.ppid for p in _ranks(tree)}) >= 2, "both workers' tests run ranks")
        _assert_stopped(run, sig, None if through == "course.py" else pytest.ExitCode.INTERRUPTED)


def _selfcheck(proc) -> bool:
    return "course_lib.instructor.selfcheck" in proc.cmdline


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", SIGNALS)
def test_course_test_stops_in_its_first_step_and_runs_no_other(tmp_path, sig):
    """`course.py test` itself: stopped in step 1 (a pytest of the graded tests on the stubs), it starts neither
    step 2 nor step 3. (Its step 3 is `course.py pytest -n N` above; its step 2, the wrong answers, below.)"""
    with Stopping([*COURSE_PY, "test"], tmp_path / "log", env=ENV) as run:
        run.wait_until(lambda tree: any("-m pytest" in p.cmdline for p in below(tree, _selfcheck)),
                       "step 1 runs pytest")
        stopped = _assert_stopped(run, sig)
    assert "step 2/3" not in stopped.log and "step 3/3" not in stopped.log, stopped.log[-3000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", SIGNALS)
def test_check_stops_with_its_ranks(tmp_path, sig):
    """`course.py check ex00` (its pytest runs in a session of its own, with the ranks below it)."""
    target = _hung_exercises(tmp_path)
    # No reference times: every test's limit is the ceiling (120 s), so the hung tests run until stopped.
    with Stopping([*COURSE_PY, "check", "ex00", "--target", str(target), "--reference-times",
                   str(tmp_path / "none.json")], tmp_path / "log", env=ENV) as run:
        run.wait_until(lambda tree: bool(_ranks(tree)), "a graded test runs ranks")
        _assert_stopped(run, sig)


@pytest.mark.timeout(300)
def test_selfcheck_wrong_answers_stops_with_its_workers(tmp_path):
    """`course.py test`'s step 2: its workers run in sessions of their own, each with a fork server and ranks."""
    with Stopping([*COURSE_PY, "selfcheck", "wrong-answers", "ex00"], tmp_path / "log", env=ENV) as run:
        run.wait_until(lambda tree: bool(_ranks(below(tree, lambda p: "wrong_answers --worker" in p.cmdline))),
                       "a worker runs ranks")
        stopped = _assert_stopped(run, signal.SIGTERM)
    assert "wrong answers lose points" not in stopped.log, "it was not stopped: it finished\n" + stopped.log[-3000:]


KERNEL_CODE = """
import time
from course_lib.dist import launch

def _wait(rank, world_size):
    time.sleep(3600)

launch(_wait, 2, timeout=3600)
"""


def _api(port: str, token: str, method: str, path: str) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/{path}", method=method, data=b"" if method == "POST"
                                     else None, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.load(reply)


FAKE_BROWSER = "#!/bin/sh\nexec sleep 600\n"  # the learner's web browser, which JupyterLab opens


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", SIGNALS)
def test_lab_stops_with_its_kernels_and_their_ranks(tmp_path, sig):
    """`course.py lab`: a kernel (a session of its own) runs launch(), whose ranks hang; one Ctrl-C stops it all,
    but the web browser JupyterLab opened (started, like a real one, in a session of its own) stays open."""
    from jupyter_client import BlockingKernelClient

    token = "course-stopping-test"
    browser = tmp_path / "fake-browser"
    browser.write_text(FAKE_BROWSER)
    browser.chmod(0o755)
    env = {**ENV, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"), "IPYTHONDIR": str(tmp_path / "ipython")}
    # A command ending in "&" is run as Python's webbrowser runs a real browser: in a session of its own.
    with Stopping([*COURSE_PY, "lab", f"--ServerApp.browser={browser} %s &", "--ServerApp.port=0",
                   f"--IdentityProvider.token={token}", "--ServerApp.terminals_enabled=False"], tmp_path / "log",
                  env=env) as run:
        deadline, port = time.monotonic() + 180, None
        while port is None and time.monotonic() < deadline and run.process.poll() is None:
            match = re.search(r"http://127\.0\.0\.1:(\d+)/lab", run.output())
            port = match and match.group(1)
            time.sleep(0.3)
        assert port, f"JupyterLab did not start:\n{run.output()[-3000:]}"
        kernel = _api(port, token, "POST", "api/kernels")["id"]
        client = BlockingKernelClient(connection_file=str(tmp_path / "runtime" / f"kernel-{kernel}.json"))
        client.load_connection_file()
        # A kernel is dead for jupyter_client when one ping goes unanswered for time_to_dead (1 s): on a loaded
        # 2-core CI machine a kernel still starting missed it ("Kernel died before replying to kernel_info"). The
        # 120 s of wait_for_ready still catch a kernel that never answers.
        client.hb_channel.time_to_dead = 30.0
        client.start_channels()
        try:
            client.wait_for_ready(timeout=120)
            client.execute(textwrap.dedent(KERNEL_CODE))
            run.wait_until(lambda tree: len(_ranks(below(tree, lambda p: "ipykernel" in p.cmdline))) >= 2
                           and any("sleep 600" in p.cmdline for p in tree), "the kernel's launch() runs two ranks")
        finally:
            client.stop_channels()
        stopped = _assert_stopped(run, sig, spare=lambda proc: "sleep 600" in proc.cmdline)
        assert [p for p in run.left() if "sleep 600" in p.cmdline], "the browser was closed\n" + stopped.report()


def _in_browser_and_checking(tree) -> bool:
    """Chromium runs, and the notebook's check() runs its pytest (a session of its own) below the kernel: the
    first of the test's two checks (its ranks come and go, each a fraction of a second on the stub)."""
    return (any("chromium" in p.cmdline and "--headless" in p.cmdline for p in tree)
            and any("-m pytest" in p.cmdline for p in below(tree, lambda p: "ipykernel" in p.cmdline)))


@pytest.mark.timeout(400)
def test_browser_test_stops_with_jupyterlab_kernel_chromium_and_check(tmp_path):
    """A browser test stopped mid-run (`course.py test` runs them): JupyterLab, its kernel, Chromium and Playwright's
    driver, and the pytest of the notebook's check() (a session of its own, below the kernel) all go."""
    pytest.importorskip("playwright")
    import browser_lab

    try:
        browser_lab.chromium_path()
    except FileNotFoundError as missing:
        pytest.skip(str(missing))
    with Stopping([*COURSE_PY, "pytest", "tests/course/browser/test_exercise_in_browser.py"], tmp_path / "log",
                  env=ENV) as run:
        run.wait_until(_in_browser_and_checking, "the notebook's check() runs, with Chromium open", timeout=300)
        stopped = _assert_stopped(run, signal.SIGTERM)
    assert "1 passed" not in stopped.log, "it was not stopped: it finished\n" + stopped.log[-3000:]
