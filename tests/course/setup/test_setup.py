"""The README's first command opens JupyterLab on the course's folder, at the welcome notebook; course.py
installs once, whatever command comes next."""

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
        def contents(folder: str) -> set[str]:
            url = f"http://127.0.0.1:{port}/api/contents/{folder}?token={token}"
            with urllib.request.urlopen(url, timeout=30) as reply:
                return {item["name"] for item in json.load(reply)["content"]}

        # The course's root, so that the exercises are in JupyterLab's file browser too, not only the lessons.
        assert {"notebooks", "exercises", "README.md"} <= contents("")
        assert {"00_welcome.ipynb", "01_devices_and_memory.ipynb"} <= contents("notebooks")
        assert "ex00_warmup.py" in contents("exercises")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/?token={token}", timeout=30) as reply:
            assert reply.status == 200 and b"JupyterLab" in reply.read()
            assert reply.url.split("?")[0].endswith("/lab/tree/notebooks/00_welcome.ipynb"), reply.url  # opens it
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
    import browser_lab
    from pyproject_toml import pyproject

    course = _course_py()
    extras = pyproject()["project"]["optional-dependencies"]
    assert course.optional_dependencies() == extras and extras[course.BROWSER_EXTRA][0].startswith("playwright")
    assert course.CHROMIUM == browser_lab.CHROMIUM_CANDIDATES


def test_without_root_a_missing_chromium_is_reported_and_the_browser_tests_skipped(monkeypatch, capsys):
    from course_lib.setup import system_packages

    monkeypatch.setattr(system_packages, "chromium", lambda: None)
    monkeypatch.setattr(system_packages.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(system_packages.subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a}"))
    _course_py().prepare_browser()
    out = capsys.readouterr().out
    assert "browser tests will be SKIPPED" in out and "sudo apt-get install -y chromium" in out


def test_as_root_a_missing_chromium_is_installed_with_apt_get_and_said_so(monkeypatch, capsys):
    from course_lib.setup import system_packages

    ran = []
    monkeypatch.setattr(system_packages, "chromium", lambda: "/usr/lib/chromium/chromium" if ran else None)
    monkeypatch.setattr(system_packages.os, "geteuid", lambda: 0)
    monkeypatch.setattr(system_packages.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(system_packages.subprocess, "run",
                        lambda command, **kwargs: ran.append(command) or subprocess.CompletedProcess(command, 0))
    _course_py().prepare_browser()
    assert ran == [["apt-get", "install", "-y", "-q", "chromium"]]
    assert "installing Debian's chromium for the browser tests" in capsys.readouterr().out


def test_course_py_says_when_a_system_package_cannot_be_installed(monkeypatch, capsys):
    course = _course_py()
    assert course.SYSTEM_PACKAGES["bwrap"] == "bubblewrap"  # the grader's sandbox, installed by `course.py test`
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # not root: nothing is installed, and it is said
    course.ensure_system_packages({"no-such-command-for-the-course": "no-such-package"})
    assert "no-such-package missing, and it takes root and apt-get to install" in capsys.readouterr().out


GROUPS = ["--dist", "loadscope", "--no-loadscope-reorder"]  # the units and their order: tests/conftest.py


@pytest.mark.parametrize("args, cores, wanted", [
    ([], 2, ["-n", "2", *GROUPS]), ([], 16, ["-n", "4", *GROUPS]), ([], 1, []),
    (["-n", "0"], 8, []), (["-n3"], 8, []), (["-p", "no:xdist"], 8, []), (["-m", "browser"], 2, ["-n", "2", *GROUPS]),
])
def test_course_py_runs_the_suite_in_workers_unless_told_otherwise(args, cores, wanted):
    assert _course_py().suite_workers(args, cores) == wanted


UNIT_SUITE = {   # a small suite laid out like the course's: a lesson file run per lesson, other files whole
    "browser/test_lessons_in_browser.py": "import pytest\n\n" + "".join(f"@pytest.mark.parametrize('lesson', ['00_a', '01_b'])\n"
                                                  f"def test_{check}(lesson, worker_of):\n    worker_of(lesson)\n\n"
                                                  for check in ("runs", "table", "loops")),
    "instructor/test_grade.py": "import pytest\n\n@pytest.mark.parametrize('n', range(4))\n"
                                "def test_student(n, worker_of):\n    worker_of('grade')\n",
    "conftest.py": "import json, os\nimport pytest\n\n@pytest.fixture\ndef worker_of(request, tmp_path_factory):\n"
                   "    def record(unit):\n        with open(os.environ['UNIT_LOG'], 'a') as log:\n"
                   "            log.write(json.dumps([unit, os.environ['PYTEST_XDIST_WORKER']]) + '\\n')\n"
                   "    return record\n",
}


def test_a_units_tests_share_one_worker_under_xdist(tmp_path):
    """What `course.py test` passes to xdist keeps a unit's tests on one worker (a lesson's run in the browser and
    the graded class are module fixtures: split over two workers, each worker ran them once more)."""
    suite = tmp_path / "suite"
    for name, text in UNIT_SUITE.items():
        (suite / name).parent.mkdir(parents=True, exist_ok=True)
        (suite / name).write_text(text)
    (suite / "tests_conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (suite / "conftest.py").write_text((suite / "conftest.py").read_text() + "\nfrom tests_conftest import *  # noqa\n"
                                       "from tests_conftest import pytest_xdist_make_scheduler  # noqa\n")
    log = tmp_path / "units.jsonl"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:randomly",
                           *_course_py().suite_workers([], 2)], cwd=suite, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "UNIT_LOG": str(log), "PYTHONPATH": str(suite)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(seen) == 10, seen
    workers = {}
    for unit, worker in seen:
        workers.setdefault(unit, set()).add(worker)
    assert all(len(w) == 1 for w in workers.values()), f"a unit's tests ran on several workers: {workers}"
    assert set().union(*workers.values()) == {"gw0", "gw1"}, f"one worker did everything: {workers}"


class FakeEnvironment:
    """An environment as course.py's install() (course_lib/setup/install.py) sees it, without pip: a prefix folder
    (where the stamp goes), the torch its metadata reports, and a pip that only records what it was asked and puts in
    the locked torch when it is not told to keep the one there."""

    def __init__(self, tmp_path, torch=""):
        self.prefix = tmp_path / "env"
        self.prefix.mkdir()
        self.torch, self.pips = torch, []

    def run(self, command, **kwargs):
        if command[1] == "-c":  # the probe
            return subprocess.CompletedProcess(command, 0, stdout=f"{self.prefix}\n{self.torch}\n", stderr="")
        assert command[1:4] == ["-m", "pip", "install"], command
        constraints = Path(command[command.index("-c") + 1]).read_text()
        self.pips.append({"constraints": constraints, "targets": command[command.index("-c") + 2:]})
        if f"torch=={self.torch}\n" not in constraints:  # not kept: pip installs constraints.txt's torch
            self.torch = re.search(r"^torch==(\S+)", constraints, re.M).group(1)
        return subprocess.CompletedProcess(command, 0)


@pytest.fixture
def fake_install(monkeypatch, tmp_path):
    from course_lib.setup import install as course

    environment = FakeEnvironment(tmp_path)
    monkeypatch.setattr(course.subprocess, "run", environment.run)
    # pip itself runs through pip_with_progress (its progress lines: test_install_progress.py)
    monkeypatch.setattr(course, "pip_with_progress", lambda command, **kwargs: environment.run(command).returncode)
    python = environment.prefix / "bin" / "python"
    return course, environment, lambda *extras: course.install(python, extras)


def test_one_install_is_enough_for_every_command_after_it(fake_install, capsys):
    course, environment, install = fake_install
    install("browser")  # `python3 course.py test` in a fresh .venv: no torch yet, constraints.txt's comes in
    assert len(environment.pips) == 1 and environment.pips[0]["constraints"] == course.LOCK.read_text()
    assert environment.pips[0]["targets"] == ["-e", f"{course.ROOT}[browser]"]
    assert "installing the course and its packages" in capsys.readouterr().out
    for extras in [(), ("browser",), ()]:  # then `check ex00`, `test`, `lab`: nothing more to install
        install(*extras)
        assert len(environment.pips) == 1, f"installed again for extras {extras}: {environment.pips[1:]}"
    assert capsys.readouterr().out == ""


def test_an_extra_asked_for_later_installs_only_its_packages(fake_install, capsys):
    course, environment, install = fake_install
    install()  # `python3 course.py lab`
    capsys.readouterr()
    install("browser")  # then `python3 course.py test`: playwright, nothing else, and the torch stays
    assert len(environment.pips) == 2
    assert environment.pips[1]["targets"] == course.optional_dependencies()["browser"]
    assert environment.pips[1]["constraints"] == f"torch=={environment.torch}\n"
    out = capsys.readouterr().out
    assert "installing what the browser tests need" in out and "torch" not in out
    install()
    install("browser")
    assert len(environment.pips) == 2


@pytest.mark.parametrize("torch", ["2.14.1+cpu", "2.11.0+cu130"])
def test_a_supported_torch_already_there_is_kept_and_said_so_plainly(fake_install, capsys, torch):
    course, environment, install = fake_install
    environment.torch = torch  # PyTorch's CPU-only wheel (the README's laptop option), or a cloud image's torch
    install()
    assert [pip["constraints"] for pip in environment.pips] == [f"torch=={torch}\n"] and environment.torch == torch
    out = capsys.readouterr().out
    assert f"this environment already has torch {torch}, which the course supports" in out
    assert "it is left as it is" in out
    install()
    assert len(environment.pips) == 1


def test_a_torch_outside_the_range_is_replaced_by_the_locked_one(fake_install, capsys):
    course, environment, install = fake_install
    environment.torch = "2.9.0"
    install()
    assert environment.pips[0]["constraints"] == course.LOCK.read_text()
    assert "torch 2.9.0 is outside the supported range" in capsys.readouterr().out
    install()
    assert len(environment.pips) == 1


@pytest.mark.parametrize("change, reason", [
    ("inputs", "pyproject.toml or constraints.txt changed"),
    ("torch", "this environment's torch changed since the last install (2.14.1 then, 2.12.0 now)"),
    ("root", "the course was installed from /elsewhere"),
    ("old format", "the record of the last install comes from an older course.py"),
])
def test_what_decides_an_install_again_is_said(fake_install, capsys, change, reason):
    course, environment, install = fake_install
    install("browser")
    stamp = environment.prefix / course.STAMP
    if change == "torch":
        environment.torch = "2.12.0"  # the learner installed another supported torch: kept, the rest checked
    elif change == "old format":
        stamp.write_text("77ef5153 /work/main browser\n")  # a stamp written before the JSON one
    else:
        stamp.write_text(json.dumps({**json.loads(stamp.read_text()), change: "/elsewhere"}))
    capsys.readouterr()
    install()
    assert len(environment.pips) == 2 and reason in capsys.readouterr().out
    if change != "old format":  # the extras installed before are kept up to date too
        assert environment.pips[1]["targets"] == ["-e", f"{course.ROOT}[browser]"]
    install()
    assert len(environment.pips) == 2


def test_lab_serves_the_course_root_and_opens_the_welcome_notebook():
    course = _course_py()
    command = course.lab_command(Path("python"), ["--no-browser"])
    assert f"--ServerApp.root_dir={ROOT}" in command
    assert "--LabApp.default_url=/lab/tree/notebooks/00_welcome.ipynb" in command
    assert (ROOT / course.WELCOME).is_file() and command[-1] == "--no-browser"
