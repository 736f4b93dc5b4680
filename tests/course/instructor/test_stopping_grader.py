"""Ctrl-C or SIGTERM stops the grader within STOP_WITHIN (10) seconds and leaves nothing running: not its judge, the
judge's sandbox (bubblewrap), fork server and ranks, nor what the student's code started.

The student's code ignores every signal, starts processes that leave its session, and never returns
(class_builder.stuck_source): each run is mid-run as soon as those processes exist, and stays so. The command is
signalled alone, as `kill PID` would (tests/course/signal_stop.py). `python3 course.py grade` grades a class of one,
without calibration; Gradescope's run_autograder runs from a package written here without calibrating it (the
package of test_gradescope.py takes minutes to build).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from course_lib.paths import ROOT
from signal_stop import STOP_WITHIN, Stopping, below

from class_builder import stuck_source
from grade_helpers import BWRAP_PROBLEM, GRADER_ENV, PYTHON, needs_solutions

SIGNALS = [pytest.param(signal.SIGINT, id="SIGINT"), pytest.param(signal.SIGTERM, id="SIGTERM")]
pytestmark = [needs_solutions, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")]
# Without bubblewrap the grader grades only when told to, in its fallback sandbox: stopping it is tested all the same.
WEAK = ["--allow-weak-isolation"] if BWRAP_PROBLEM else []
STUDENT_FORKS = 20  # the processes stuck_source starts, each in a session of its own


def _stuck_student_runs(tree) -> bool:
    """The judge (the pytest with --confine, or a child of the judge zygote) has the student's forks below it: the
    student's code is running."""
    zygotes = {p.pid for p in tree if "judge_zygote" in p.cmdline}
    return len(below(tree, lambda p: "--confine" in p.cmdline or p.ppid in zygotes)) >= STUDENT_FORKS


def _assert_stopped(run: Stopping, sig: int):
    stopped = run.stop(sig)
    print(stopped.report())
    assert stopped.seconds <= STOP_WITHIN and not stopped.left, stopped.report()
    return stopped


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", SIGNALS)
def test_grade_stops_its_judge_and_sandbox(tmp_path, sig):
    submissions = tmp_path / "submissions"
    (submissions / "stuck").mkdir(parents=True)
    (submissions / "stuck" / "ex00_warmup.py").write_text(stuck_source())
    command = [PYTHON, str(ROOT / "course.py"), "grade", str(submissions), "--out", str(tmp_path / "out"),
               "--exercises", "ex00", "--no-calibration", "--no-progress", "--timeout", "300", "--test-timeout", "120",
               "--address-space-gb", "0", *WEAK]
    with Stopping(command, tmp_path / "log", cwd=tmp_path, env={**GRADER_ENV, "VIRTUAL_ENV": sys.prefix}) as run:
        run.wait_until(_stuck_student_runs, "the stuck student's code runs in its judge")
        stopped = _assert_stopped(run, sig)
    assert stopped.returncode == 128 + sig and "interrupted" in stopped.log, stopped.log[-3000:]
    assert not (tmp_path / "out" / "grades.csv").exists()


def _package(folder: Path) -> Path:
    """An autograder package of ex00 as `course.py grade gradescope` writes it, but with no calibration: every test
    gets the 120 s limit, far more than this test waits."""
    from course_lib.instructor.grade.gradescope import _write_zip

    config = {"exercises": ["ex00"], "exercise_files": ["ex00_warmup.py"], "time_limits": {},
              "time_limits_after_a_loop": {}, "limit_note": "not calibrated (a test of stopping the grader)",
              "hypothesis_profile": "quick", "timeout": 300, "test_timeout": 120, "memory_gb": 4, "graded_tests": []}
    archive = folder / "autograder.zip"
    _write_zip(archive, config, ["ex00"], None)
    source = folder / "root" / "source"
    with zipfile.ZipFile(archive) as package:
        for info in package.infolist():  # like unzip: with the modes the zip gives (extractall drops them)
            path = source / info.filename
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(package.read(info))
            path.chmod(stat.S_IMODE(info.external_attr >> 16) or 0o644)
    for name in ("submission", "results"):
        (folder / "root" / name).mkdir()
    return folder / "root"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", SIGNALS)
def test_run_autograder_stops_its_judge_and_sandbox(tmp_path, sig):
    # Readable by all, like an instructor's files: student code runs as a user of its own where the grader is root
    # (pytest's tmp_path is in a folder only root may enter).
    base = Path(tempfile.mkdtemp(prefix="course-stopping-test-"))
    os.chmod(base, 0o755)
    try:
        _stop_run_autograder(base, tmp_path, sig)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _stop_run_autograder(base: Path, tmp_path: Path, sig: int) -> None:
    root = _package(base)
    (root / "submission" / "ex00_warmup.py").write_text(stuck_source())
    env = {**GRADER_ENV, "AUTOGRADER_ROOT": str(root), "COURSE_PYTHON": PYTHON}
    with Stopping(["bash", str(root / "source" / "run_autograder")], tmp_path / "log", cwd=root, env=env) as run:
        run.wait_until(_stuck_student_runs, "the stuck student's code runs in its judge")
        stopped = _assert_stopped(run, sig)
    assert stopped.returncode == 0, stopped.report()  # run_autograder always exits 0, having written results.json
    results = json.loads((root / "results" / "results.json").read_text())  # Gradescope still gets one, saying so
    assert results["score"] == 0 and "stopped before it finished" in results["output"], results
