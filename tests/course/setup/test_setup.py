"""The README's first command opens JupyterLab on the notebooks."""

from __future__ import annotations

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
        try:
            os.killpg(lab.pid, signal.SIGTERM)
            lab.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(lab.pid, signal.SIGKILL)
            lab.wait()


def test_course_py_without_a_command_prints_its_usage():
    done = subprocess.run([sys.executable, str(ROOT / "course.py")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "python3 course.py lab" in done.stdout and "python3 course.py test" in done.stdout


def test_course_py_says_when_a_system_package_cannot_be_installed(monkeypatch, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_script", ROOT / "course.py")
    course = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(course)
    assert course.SYSTEM_PACKAGES["bwrap"] == "bubblewrap"  # the grader's sandbox, installed by `course.py test`
    monkeypatch.setattr(course.os, "geteuid", lambda: 1000)  # not root: nothing is installed, and it is said
    course.ensure_system_packages({"no-such-command-for-the-course": "no-such-package"})
    assert "no-such-package missing, and it takes root and apt-get to install" in capsys.readouterr().out
