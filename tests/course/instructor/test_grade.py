"""The instructor's grader: a class of honest, cheating and misbehaving submissions, each graded as it deserves.

The class (class_builder.py) is graded on ex00 only, with one hidden test, two at a time; every student's
row, results.json and feedback are checked, and the grading must end in bounded time. The test makes two
copies of the solutions outside the course folder (in a temp folder and a fake home folder) and runs a
service on the host that hands out the solution: the spy and the network student must get nothing from
either. Set COURSE_GRADE_UID_BASE to keep the students' users apart from another grader's on this machine.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from course_lib.grading.results import Report, TestOutcome
from course_lib.instructor.grade.judge import classify, merge
from course_lib.instructor.grade.memory_cgroup import detect_cgroup
from course_lib.instructor.grade.report import Result
from course_lib.instructor.grade.sandbox import probe_bwrap
from course_lib.instructor.grade.submissions import collect_exercise_files
from course_lib.instructor.grade.users import processes_of
from course_lib.paths import ROOT

from class_builder import (EXPECTED, SolutionService, build_class, copy_solution_folder, copy_solutions_to, sources,
                           stuck_source)
PYTHON = sys.executable
TEST_TIMEOUT = 15  # seconds: the most any test of the class may take (the calibrated limits are lower)
CLASS_LIMIT = 600  # the whole class must be graded within this (about 4 minutes on 2 busy cores)
LOOP_MARGIN = 60  # a student who loops everywhere: the sum of its tests' limits + this (its judge's start)


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


@pytest.fixture(scope="module")
def graded_class():
    # Not pytest's tmp_path: its folders are private to root, which would hide the class from the students'
    # users whatever the grader did. Here everything is readable by all, as an instructor's files often are.
    base = Path(tempfile.mkdtemp(prefix="course-grade-test-"))
    elsewhere = [Path(tempfile.mkdtemp(prefix="course-copy-")), Path(tempfile.mkdtemp(prefix="course-home-"))]
    os.chmod(base, 0o755)
    service = SolutionService()
    service.start()
    try:
        copies = [copy_solutions_to(elsewhere[0], "solutions"), copy_solutions_to(elsewhere[1], "alice/course/solutions")]
        yield _grade_the_class(base, copies, service)
    finally:
        service.close()
        for folder in [base, *elsewhere]:
            shutil.rmtree(folder, ignore_errors=True)


def _grade_the_class(base: Path, copies: list[Path], service: SolutionService) -> dict:
    paths = build_class(base, copies, service.addresses)
    before = {p: p.read_bytes() for p in paths["submissions"].rglob("*") if p.is_file() and not p.is_symlink()}
    done, seconds = _grade(paths["submissions"], paths["out"], "--jobs", "2", "--timeout", "200",
                           "--test-timeout", str(TEST_TIMEOUT), "--tests", str(paths["hidden"]), limit=CLASS_LIMIT + 60)
    copies_there = all((c / "ex00_warmup.py").exists() for c in copies)
    return {**paths, "done": done, "seconds": seconds, "before": before, "service": service,
            "copies_there": copies_there}


def _users(stderr: str) -> list[int]:
    """The students' users the grader said it used."""
    found = re.search(r"students' code runs as users ([\d, ]+)", stderr)
    return [int(u) for u in found.group(1).split(",")] if found else []


@needs_solutions
@needs_root_linux
@needs_bwrap
def test_class_is_graded_in_bounded_time_with_one_row_per_student(graded_class):
    done = graded_class["done"]
    assert done.returncode == 0, done.stdout + done.stderr
    assert graded_class["seconds"] < CLASS_LIMIT, f"grading took {graded_class['seconds']:.0f} s"
    rows = _rows(graded_class["out"])
    assert set(rows) == set(EXPECTED)
    assert list(rows["correct"])[:7] == ["student", "status", "ex00", "ex00 hidden", "total", "possible", "not graded"]
    assert "protections:" in done.stderr and "a user of its own" in done.stderr and "allow-list" in done.stderr
    assert "time limits per test" in done.stderr and (graded_class["out"] / "time_limits.json").exists()


@needs_solutions
@needs_root_linux
@needs_bwrap
@pytest.mark.parametrize("student", sorted(EXPECTED))
def test_each_student_gets_what_they_deserve(graded_class, student):
    status, total = EXPECTED[student]
    row = _rows(graded_class["out"])[student]
    assert (row["status"], float(row["total"]), float(row["possible"])) == (status, total, 8.0), row
    results = json.loads((graded_class["out"] / student / "results.json").read_text())
    assert results["score"] == total
    assert len(results["tests"]) == 5 and sum(t["max_score"] for t in results["tests"]) == 8
    assert sum(t["score"] for t in results["tests"]) == total
    for test in results["tests"]:
        assert test["status"] == ("passed" if test["score"] == test["max_score"] else "failed")
    hidden = [t for t in results["tests"] if t["visibility"] == "hidden"]
    assert len(hidden) == 1 and "shard_range_edges" not in hidden[0]["name"]
    assert float(row["ex00 hidden"]) == hidden[0]["score"]
    feedback = (graded_class["out"] / student / "feedback.md").read_text()
    assert f"**{total:g} / 8 points**" in feedback


def _messages(graded_class, student: str) -> dict[str, str]:
    results = json.loads((graded_class["out"] / student / "results.json").read_text())
    return {t["name"]: t["output"] for t in results["tests"] if t["visibility"] == "visible"}


@needs_solutions
@needs_root_linux
@needs_bwrap
def test_hangs_are_killed_at_the_test_timeout_and_exits_are_failures(graded_class):
    loop = _messages(graded_class, "infinite_loop")
    assert all("Timeout" in m for n, m in loop.items() if "all_reduce" in n), loop
    deaf = _messages(graded_class, "ignores_signals")
    assert all("Timeout" in m for n, m in deaf.items() if "shard_range" in n), deaf
    for student in ("sys_exit", "os_exit"):
        messages = _messages(graded_class, student)
        assert all("exit" in m for m in messages.values()), messages
    assert any("rank" in m for n, m in _messages(graded_class, "os_exit").items() if "all_reduce" in n)
    hog = _messages(graded_class, "memory_hog")
    assert all("MemoryError" in m for n, m in hog.items() if "shard_range" in n), hog


@needs_solutions
@needs_root_linux
@needs_bwrap
def test_a_student_who_loops_everywhere_costs_seconds_per_test(graded_class):
    limits = json.loads((graded_class["out"] / "time_limits.json").read_text())["limits"]
    assert len(limits) == 5 and all(seconds <= TEST_TIMEOUT for seconds in limits.values()), limits
    loops = _messages(graded_class, "loops_everywhere")
    assert all("Timeout" in m and "reference solution's time" in m for m in loops.values()), loops
    bound = sum(limits.values()) + LOOP_MARGIN  # every test at its limit, and the judge's start
    seconds = float(_rows(graded_class["out"])["loops_everywhere"]["seconds"])
    assert seconds < bound, f"loops_everywhere took {seconds:.0f} s; the bound is {bound:.0f} s"


@needs_solutions
@needs_root_linux
@needs_bwrap
def test_cheats_cannot_reach_solutions_hidden_tests_or_other_files(graded_class):
    copier = " ".join(_messages(graded_class, "copier").values())
    assert "copier found nothing to copy" in copier and "saw hidden tests: ," not in copier
    assert "test_ex00_hidden" not in copier
    victim = graded_class["victim"]
    assert victim.read_text() == "the instructor's file\n"
    assert not (victim.parent / "pwned").exists()
    after = {p: p.read_bytes() for p in graded_class["submissions"].rglob("*") if p.is_file() and not p.is_symlink()}
    assert after == graded_class["before"], "a submission was changed during grading"
    assert (graded_class["hidden"] / "test_ex00_hidden.py").exists()
    assert not (graded_class["out"] / "grades.csv").read_text().count("fake_summary,100")
    assert "no exNN_*.py files" in _rows(graded_class["out"])["symlinker"]["detail"]


@needs_solutions
@needs_root_linux
@needs_bwrap
def test_other_copies_of_the_solutions_and_the_network_are_out_of_reach(graded_class):
    assert graded_class["copies_there"], "the copies of the solutions the spy looks for were gone during grading"
    spy = " ".join(_messages(graded_class, "spy").values())
    assert "spy found no copy of the solutions" in spy, spy
    network = " ".join(_messages(graded_class, "network").values())
    assert "network found nothing" in network and "unreachable" in network, network
    assert graded_class["service"].connections == [], "student code reached the service on the host"


@needs_solutions
@needs_root_linux
@needs_bwrap
def test_nothing_a_student_started_outlives_the_grading(graded_class):
    users = _users(graded_class["done"].stderr)
    assert len(users) == 2
    for uid in users:
        assert processes_of(uid) == [], f"processes of user {uid} are still running"


@needs_solutions
@needs_root_linux
@pytest.mark.parametrize("limiter", ["cgroup", "watchdog"])
def test_a_stuck_student_times_out_without_delaying_the_others(tmp_path, limiter):
    """Also the CUDA machine's case (no address-space limit; on the lent H100 there was no cgroup either): the
    stuck student's 20 forked children share the pages of the process they were forked from, which must not
    count 21 times towards its memory limit."""
    if limiter == "cgroup" and _cgroup_problem():
        pytest.skip(_cgroup_problem())
    submissions = tmp_path / "submissions"
    (submissions / "stuck").mkdir(parents=True)
    (submissions / "stuck" / "ex00_warmup.py").write_text(stuck_source())
    copy_solution_folder(submissions / "honest")
    (submissions / "broken.zip").write_bytes(b"PK\x03\x04 this is not a zip file")
    # 40 s per student: the honest one needs about 15 s alone, and the suite runs beside another pytest worker
    # (course.py test) while the stuck one's 20 children spin; at 25 s it ran out with 5 of 7 points.
    done, seconds = _grade(submissions, tmp_path / "out", "--jobs", "2", "--timeout", "40", "--test-timeout", "120",
                           "--no-calibration", "--address-space-gb", "0", "--memory-limiter", limiter, limit=240)
    rows = _rows(tmp_path / "out")
    assert rows["stuck"]["status"] == "timeout" and rows["stuck"]["total"] == "0" and rows["stuck"]["possible"] == "7"
    assert "time limit" in rows["stuck"]["detail"]
    assert 40 <= float(rows["stuck"]["seconds"]) < 80
    assert (rows["honest"]["status"], rows["honest"]["total"]) == ("ok", "7"), rows["honest"]["detail"]
    assert float(rows["honest"]["seconds"]) < 80
    assert rows["broken"]["status"] == "grader error" and rows["broken"]["total"] == ""
    assert "zip" in rows["broken"]["detail"]
    assert "could not be graded automatically" in (tmp_path / "out" / "broken" / "feedback.md").read_text()
    assert done.returncode == 1  # a grader error is never silent
    stuck = json.loads((tmp_path / "out" / "stuck" / "results.json").read_text())
    assert all(t["status"] == "failed" and "time limit" in t["output"] for t in stuck["tests"])
    assert seconds < 120
    for uid in _users(done.stderr):
        assert processes_of(uid) == [], f"processes of user {uid} are still running"


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


@needs_solutions
@needs_root_linux
@pytest.mark.parametrize("limiter", ["cgroup", "watchdog"])
def test_a_memory_hog_without_an_address_space_limit_is_stopped_with_a_memory_message(tmp_path, limiter):
    """The CUDA machine's case: no RLIMIT_AS (CUDA reserves too much), so the cgroup or the watchdog must act."""
    if limiter == "cgroup" and _cgroup_problem():
        pytest.skip(_cgroup_problem())
    submissions = _small_class(tmp_path, ["correct", "memory_hog"])
    # --time-floor: the hog fills pages for a few seconds before the limit; it must meet the memory limit first.
    done, _ = _grade(submissions, tmp_path / "out", "--jobs", "2", "--address-space-gb", "0", "--memory-gb", "2",
                     "--memory-limiter", limiter, "--time-floor", "40", "--test-timeout", "60", limit=400)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no address-space limit per process" in done.stderr
    rows = _rows(tmp_path / "out")
    assert (rows["correct"]["total"], rows["memory_hog"]["total"]) == ("7", "4"), rows
    results = json.loads((tmp_path / "out" / "memory_hog" / "results.json").read_text())
    hog = {t["name"]: t["output"] for t in results["tests"] if "shard_range" in t["name"]}
    how = "memory cgroup" if limiter == "cgroup" else "memory watchdog"
    assert all("more than 2 GiB of memory" in m and how in m for m in hog.values()), hog


@needs_solutions
@needs_root_linux
def test_the_fallback_without_bubblewrap_hides_the_known_secrets_and_says_what_it_cannot(tmp_path):
    elsewhere = Path(tempfile.mkdtemp(prefix="course-copy-"))
    try:
        copy = copy_solutions_to(elsewhere, "solutions")
        submissions = _small_class(tmp_path, ["correct", "copier", "spy"], copies=[copy])
        done, _ = _grade(submissions, tmp_path / "out", "--jobs", "2", "--isolation", "unshare", limit=400)
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # Where bubblewrap is installed the fallback was asked for; where it is not (the lent H100), it is missing.
    assert ("WARNING: --isolation unshare: bubblewrap is NOT used" in done.stderr
            or "WARNING: bubblewrap is missing" in done.stderr), done.stderr
    assert "any OTHER copy of the course on this machine" in done.stderr
    rows = _rows(tmp_path / "out")
    assert rows["correct"]["total"] == "7" and rows["copier"]["total"] == "0"  # the course's own solutions: hidden
    assert rows["spy"]["total"] == "7"  # what the warning says: the copy elsewhere stays readable


def test_status_says_timeout_crash_or_grader_error_never_a_silent_zero():
    assert classify(1, False, Report(exitstatus=1), 60)[0] == "ok"
    assert classify(1, False, Report(), 60)[0] == "grader error"  # the judge never finished its report
    assert classify(None, True, None, 60)[0] == "timeout"
    status, why = classify(-9, False, None, 60)
    assert status == "crashed" and "SIGKILL" in why
    assert classify(0, False, None, 60) == ("grader error", "pytest finished but its report is missing or unreadable")
    assert classify(4, False, None, 60)[0] == "grader error"


def test_tests_not_finished_count_as_failed_and_gpu_tests_as_not_graded():
    expected = [
        TestOutcome("tests/test_ex01_x.py::a", 2),
        TestOutcome("tests/test_ex01_x.py::b", 3, not_graded="needs 2 CUDA GPUs; this machine has 0"),
        TestOutcome("tests/hidden/test_ex01_y.py::c", 1),
    ]
    finished = {"tests/test_ex01_x.py::a": TestOutcome("tests/test_ex01_x.py::a", 2, "passed")}
    rows = merge(expected, finished, "timeout")
    assert [(r.status, r.earned, r.possible) for r in rows] == [
        ("passed", 2, 2), ("not graded", 0, 0), ("failed", 0, 1)]
    assert "time limit" in rows[2].message
    result = Result("ann", "timeout", "", rows, 1.0)
    assert (result.earned(), result.possible(), result.earned("ex01", hidden=True)) == (2, 3, 0)


def test_only_exercise_files_are_taken_from_a_submission(tmp_path):
    folder = tmp_path / "student" / "my-course" / "exercises"
    folder.mkdir(parents=True)
    (folder / "ex00_warmup.py").write_text("x = 1\n")
    (folder / "conftest.py").write_text("raise SystemExit\n")
    (folder / "ex01_devices.py").symlink_to("/etc/passwd")
    (tmp_path / "student" / "my-course" / "solutions").mkdir()
    (tmp_path / "student" / "my-course" / "solutions" / "ex04_collectives.py").write_text("y = 2\n")
    files, where = collect_exercise_files(tmp_path / "student")
    assert files == {"ex00_warmup.py": b"x = 1\n"} and where == "my-course/exercises"
    archive = tmp_path / "student.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("ex/exercises/ex00_warmup.py", "a = 1\n")
        z.writestr("ex/solutions/ex00_warmup.py", "b = 2\n")
        z.writestr("../../evil/ex01_devices.py", "c = 3\n")
        z.writestr("ex/exercises/conftest.py", "d = 4\n")
    files, where = collect_exercise_files(archive)
    assert files == {"ex00_warmup.py": b"a = 1\n"} and where == "ex/exercises"
