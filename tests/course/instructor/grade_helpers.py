"""What the grader's tests share: how they run the grader, read its gradebook, and what they need of the machine."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_lib.instructor.grade.memory_cgroup import detect_cgroup
from course_lib.instructor.grade.sandbox import probe_bwrap
from course_lib.paths import ROOT

from class_builder import sources

PYTHON = sys.executable


def _bwrap_problem() -> str | None:
    if not sys.platform.startswith("linux"):
        return "not Linux"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (Debian: apt-get install bubblewrap; python3 course.py test does it as root)"
    ok, why = probe_bwrap(bwrap, os.geteuid() == 0)
    return None if ok else f"bubblewrap cannot make a sandbox here: {why}"


BWRAP_PROBLEM = _bwrap_problem()
needs_solutions = pytest.mark.skipif(not (ROOT / "solutions" / "ex00_warmup.py").exists(),
                                     reason="needs the reference solutions (not in the student release)")
needs_root_linux = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                      reason="the full sandbox (a user per student) needs root on Linux")
needs_bwrap = pytest.mark.skipif(BWRAP_PROBLEM is not None,
                                 reason=f"the allow-list sandbox is NOT tested here: {BWRAP_PROBLEM}")


# The grader's tests grade for minutes in module fixtures, longer on a busy machine. Each grading has the limits the
# grader itself sets (each test's calibrated limit, each student's --timeout, a package's timeout) and the tests add
# JUDGE_START for a judge to start; pytest-timeout's HANG_GUARD on the tests that set them up only catches a hang.
JUDGE_START = 120  # seconds
HANG_GUARD = 3600  # seconds


# These tests test the grader, not ex00 (whose full property tests run in the graded suite): its judges draw two
# inputs per property test besides the explicit examples, which is what decides each student's verdict here.
GRADER_ENV = {**os.environ, "COURSE_HYPOTHESIS": "quick"}


def _grade(submissions: Path, out: Path, *extra: str, limit: float) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([PYTHON, "-m", "course_lib.grade", str(submissions), "--out", str(out), "--exercises", "ex00",
                           "--no-progress", *extra], cwd=ROOT, capture_output=True, text=True, timeout=limit,
                          env=GRADER_ENV)
    return done, time.monotonic() - started


def _rows(out: Path) -> dict[str, dict]:
    with open(out / "grades.csv", newline="") as handle:
        return {row["student"]: row for row in csv.DictReader(handle)}


def _users(stderr: str) -> list[int]:
    """The students' users the grader said it used."""
    found = re.search(r"students' code runs as users ([\d, ]+)", stderr)
    return [int(u) for u in found.group(1).split(",")] if found else []


def _small_class(base: Path, names: list[str], **paths) -> Path:
    """Some of the class's students, each a folder with its ex00_warmup.py."""
    texts = sources({"victim": base / "victim", "submissions": base / "submissions", "out": base / "out",
                     "hidden": base / "hidden", **paths})
    for name in names:
        (base / "submissions" / name).mkdir(parents=True)
        (base / "submissions" / name / "ex00_warmup.py").write_text(texts[name])
    return base / "submissions"


def _cgroup_problem() -> str | None:
    info = detect_cgroup() if sys.platform.startswith("linux") else None
    if info is None or info.memory is None:
        return f"no memory cgroup can be made here ({info.problem if info else 'no cgroup file system'})"
    return None
