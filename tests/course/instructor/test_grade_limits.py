"""The grader's limits, each on a small class: a stuck student, a memory hog without an address-space limit, the
fallback sandbox without bubblewrap (and the refusal to use it unless the instructor allows it).

Apart from test_grade.py (the whole class) so that pytest-xdist runs the two files side by side.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from course_lib.instructor.grade.users import processes_of
from course_lib.paths import ROOT

from class_builder import copy_solution_folder, copy_solutions_to, stuck_source
from grade_helpers import (GRADER_ENV, PYTHON, _cgroup_problem, _grade, _rows, _small_class, _users, needs_root_linux,
                           needs_solutions)


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
    # 50 s per student: the honest one needs about 15 s alone, and the suite runs beside other pytest workers
    # (course.py test); at 25 s it ran out with 5 of 7 points, and at 40 s once on a machine loaded 4 times over.
    done, seconds = _grade(submissions, tmp_path / "out", "--jobs", "2", "--timeout", "50", "--test-timeout", "120",
                           "--no-calibration", "--address-space-gb", "0", "--memory-limiter", limiter, limit=240)
    rows = _rows(tmp_path / "out")
    assert rows["stuck"]["status"] == "timeout" and rows["stuck"]["total"] == "0" and rows["stuck"]["possible"] == "7"
    assert "time limit" in rows["stuck"]["detail"]
    assert 50 <= float(rows["stuck"]["seconds"]) < 90
    assert (rows["honest"]["status"], rows["honest"]["total"]) == ("ok", "7"), rows["honest"]["detail"]
    assert float(rows["honest"]["seconds"]) < 90
    assert rows["broken"]["status"] == "grader error" and rows["broken"]["total"] == ""
    assert "zip" in rows["broken"]["detail"]
    assert "could not be graded automatically" in (tmp_path / "out" / "broken" / "feedback.md").read_text()
    assert done.returncode == 1  # a grader error is never silent
    stuck = json.loads((tmp_path / "out" / "stuck" / "results.json").read_text())
    assert all(t["status"] == "failed" and "time limit" in t["output"] for t in stuck["tests"])
    assert seconds < 130
    for uid in _users(done.stderr):
        assert processes_of(uid) == [], f"processes of user {uid} are still running"


@needs_solutions
@needs_root_linux
@pytest.mark.parametrize("limiter", ["cgroup", "watchdog"])
def test_a_memory_hog_without_an_address_space_limit_is_stopped_with_a_memory_message(tmp_path, limiter):
    """The CUDA machine's case: no RLIMIT_AS (CUDA reserves too much), so the cgroup or the watchdog must act."""
    if limiter == "cgroup" and _cgroup_problem():
        pytest.skip(_cgroup_problem())
    submissions = _small_class(tmp_path, ["correct", "memory_hog"])
    # 60 s a test, uncalibrated (no reference run: it has a test of its own): the hog fills pages for a few seconds
    # before the limit, and must meet the memory limit before the time limit.
    done, _ = _grade(submissions, tmp_path / "out", "--jobs", "2", "--address-space-gb", "0", "--memory-gb", "2",
                     "--memory-limiter", limiter, "--no-calibration", "--test-timeout", "60", limit=400)
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
        done, _ = _grade(submissions, tmp_path / "out", "--jobs", "2", "--isolation", "unshare",
                         "--allow-weak-isolation", "--no-calibration", limit=400)
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
    # ... but the instructor is told: the row and results.json say the isolation, the report names the copy read.
    assert {row["isolation"] for row in rows.values()} == {"unshare"}
    assert int(rows["spy"]["opened outside"]) >= 1 and rows["correct"]["opened outside"] == "0", rows
    spy = json.loads((tmp_path / "out" / "spy" / "results.json").read_text())["extra_data"]
    assert spy["isolation"] == "unshare"
    assert f"opened {copy / 'ex00_warmup.py'}" in spy["opened_outside_allow_list"], spy
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| spy | unshare | 7 / 7 |" in summary and str(copy / "ex00_warmup.py") in summary, summary
    assert "spy: FLAGGED (unshare)" in done.stdout


@pytest.mark.parametrize("how", ["unshare", "none", "auto without bubblewrap"])
def test_grading_without_bubblewrap_is_refused_unless_allowed(tmp_path, how):
    (tmp_path / "submissions" / "ann").mkdir(parents=True)
    env = dict(GRADER_ENV)
    if how.startswith("auto"):
        (tmp_path / "bin").mkdir()  # a PATH without bwrap (or unshare): auto falls back as far as it can
        env["PATH"] = str(tmp_path / "bin")
        args = []
    else:
        args = ["--isolation", how]
    done = subprocess.run([PYTHON, "-m", "course_lib.grade", str(tmp_path / "submissions"), "--out",
                           str(tmp_path / "out"), *args], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "refusing to grade without bubblewrap" in done.stderr
    assert "apt-get install bubblewrap" in done.stderr and "--allow-weak-isolation" in done.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_the_time_limits_are_one_short_line_and_a_table_in_time_limits_json(tmp_path):
    """The grader and the Gradescope build print one line, whatever the number of tests (every test's limit on one
    line was 2,300 characters for the 162 graded tests); the limits go to a table in OUT/time_limits.json."""
    from course_lib.grading import time_rule
    from course_lib.instructor.grade.time_limits import TimeLimits

    durations = {f"tests/test_ex0{i % 9}_x.py::test_{i}[{i}]": 0.05 + 0.01 * i for i in range(161)}
    durations["tests/test_ex08_x.py::test_slow"] = 40.0  # 4 × 40 s = 160 s: the ceiling
    factor, floor, ceiling = time_rule.FACTOR, time_rule.FLOOR, time_rule.CEILING
    limits = TimeLimits(time_rule.calibrated_limits(durations), factor, floor, ceiling, durations, 81.6, 0, "cache",
                        False, time_rule.limits_after_a_loop(durations))
    table = tmp_path / "out" / "time_limits.json"
    table.parent.mkdir()
    limits.write(table)
    line = limits.summary(table)
    at_floor = sum(factor * seconds <= floor for seconds in durations.values())
    assert line == (f"[grade] time limits: 162 tests, 3–120 s (4 × the reference solution's time, at least 3 s, "
                    f"at most 120 s: {at_floor} at the floor; reference times measured now in 82 s); each test's in "
                    f"{table}")
    assert len(line) - len(str(table)) < 200 and "\n" not in line
    limits.cached = True
    assert "reference times cached)" in limits.summary(table)

    data = json.loads(table.read_text())
    assert data["rule"] == limits.note() and data["limits"] == limits.limits and data["cached"] is False  # as before
    rows = {row["test"]: row for row in data["tests"]}
    assert list(rows) == list(durations) and all(set(row) == {"test", "reference_seconds", "limit_seconds", "how",
                                                                 "limit_after_a_loop_seconds"} for row in rows.values())
    assert rows["tests/test_ex00_x.py::test_0[0]"] == {
        "test": "tests/test_ex00_x.py::test_0[0]", "reference_seconds": 0.05, "limit_seconds": 3.0,
        "how": "the floor (4 × 0.05 s is less)", "limit_after_a_loop_seconds": 1.0}
    assert rows["tests/test_ex06_x.py::test_150[150]"] == {
        "test": "tests/test_ex06_x.py::test_150[150]", "reference_seconds": 1.55, "limit_seconds": 6.2,
        "how": "4 × 1.55 s, the reference's time", "limit_after_a_loop_seconds": 6.2}
    assert rows["tests/test_ex08_x.py::test_slow"]["how"] == "the ceiling (4 × 40 s is more)"
    assert rows["tests/test_ex08_x.py::test_slow"]["limit_seconds"] == 120.0
    for row in rows.values():  # each row's words say what the rule gave
        assert row["limit_seconds"] == time_rule.calibrated_limits({"t": row["reference_seconds"]})["t"]
        assert row["how"].startswith("the floor") == (factor * row["reference_seconds"] <= floor), row
