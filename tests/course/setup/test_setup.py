"""The README's first command opens JupyterLab on the notebooks."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from course_lib.paths import ROOT


@pytest.mark.timeout(300)
def test_course_lab_serves_the_notebooks(tmp_path):
    token = "course-test-token"
    env = {
        **os.environ,
        "VIRTUAL_ENV": sys.prefix,  # this environment counts as the active one: nothing new is created
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
    }
    log = tmp_path / "lab.log"
    with open(log, "w") as out:
        lab = subprocess.Popen(
            [sys.executable, str(ROOT / "course.py"), "lab", "--no-browser", "--ServerApp.port=0",
             f"--IdentityProvider.token={token}"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
    try:
        deadline, port = time.monotonic() + 240, None
        while port is None and time.monotonic() < deadline and lab.poll() is None:
            match = re.search(r"http://127\.0\.0\.1:(\d+)/lab", log.read_text())
            port = match and match.group(1)
            time.sleep(0.5)
        assert port, f"JupyterLab did not start:\n{log.read_text()[-3000:]}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token={token}", timeout=30) as reply:
            listing = json.load(reply)
        names = {item["name"] for item in listing["content"]}
        assert "00_welcome.ipynb" in names and "01_devices_and_memory.ipynb" in names
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=30) as reply:
            assert reply.status == 200 and b"JupyterLab" in reply.read()
    finally:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError):  # the group is gone when JupyterLab could not start
                os.killpg(lab.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                lab.wait(timeout=wait)
                break


def test_course_py_without_a_command_prints_its_usage():
    done = subprocess.run([sys.executable, str(ROOT / "course.py")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "python3 course.py lab" in done.stdout and "python3 course.py test" in done.stdout


def _course_py():
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_py", ROOT / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("args, wanted", [
    ([], True), (["-m", "browser"], True), (["-k", "welcome"], True),
    (["-m", "not browser"], False), (["-mnot browser"], False), (["-m", "not gpu and not  browser"], False),
])
def test_course_py_installs_the_browser_tools_unless_the_browser_tests_are_left_out(args, wanted):
    assert _course_py().wants_browser_tests(args) is wanted


def test_course_py_and_the_browser_tests_agree_on_playwright_and_chromium():
    import tomllib

    import browser_lab

    course = _course_py()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert course.optional_dependencies() == extras and extras[course.BROWSER_EXTRA][0].startswith("playwright")
    assert course.CHROMIUM == browser_lab.CHROMIUM_CANDIDATES


def test_without_root_a_missing_chromium_is_reported_and_the_browser_tests_skipped(monkeypatch, capsys):
    course = _course_py()
    monkeypatch.setattr(course, "chromium", lambda: None)
    monkeypatch.setattr(course.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(course.subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a}"))
    course.prepare_browser()
    out = capsys.readouterr().out
    assert "browser tests will be SKIPPED" in out and "sudo apt-get install -y chromium" in out


def test_as_root_a_missing_chromium_is_installed_with_apt_get_and_said_so(monkeypatch, capsys):
    course = _course_py()
    ran = []
    monkeypatch.setattr(course, "chromium", lambda: "/usr/lib/chromium/chromium" if ran else None)
    monkeypatch.setattr(course.os, "geteuid", lambda: 0)
    monkeypatch.setattr(course.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(course.subprocess, "run",
                        lambda command, **kwargs: ran.append(command) or subprocess.CompletedProcess(command, 0))
    course.prepare_browser()
    assert ran == [["apt-get", "install", "-y", "-q", "chromium"]]
    assert "installing Debian's chromium for the browser tests" in capsys.readouterr().out


def test_course_py_says_when_a_system_package_cannot_be_installed(monkeypatch, capsys):
    course = _course_py()
    assert course.SYSTEM_PACKAGES["bwrap"] == "bubblewrap"  # the grader's sandbox, installed by `course.py test`
    monkeypatch.setattr(course.os, "geteuid", lambda: 1000)  # not root: nothing is installed, and it is said
    course.ensure_system_packages({"no-such-command-for-the-course": "no-such-package"})
    assert "no-such-package missing, and it takes root and apt-get to install" in capsys.readouterr().out


@pytest.mark.parametrize("args, cores, wanted", [
    ([], 2, ["-n", "2", "--dist", "loadfile"]), ([], 16, ["-n", "4", "--dist", "loadfile"]), ([], 1, []),
    (["-n", "0"], 8, []), (["-n3"], 8, []), (["-p", "no:xdist"], 8, []), (["-m", "browser"], 2, ["-n", "2", "--dist", "loadfile"]),
])
def test_course_py_runs_the_suite_in_workers_unless_told_otherwise(args, cores, wanted):
    assert _course_py().suite_workers(args, cores) == wanted
