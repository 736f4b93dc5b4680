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
import shutil
import tempfile
import zipfile
from pathlib import Path

import pytest

from course_lib.grading.results import Report, TestOutcome
from course_lib.instructor.grade.judge import classify, merge
from course_lib.instructor.grade.report import (NOT_GRADED_HEADING, Result, pass_rates, write_feedback,
                                               write_gradebook, write_results_json, write_summary)
from course_lib.instructor.grade.submissions import collect_exercise_files
from course_lib.instructor.grade.users import processes_of

from class_builder import EXPECTED, SolutionService, build_class, copy_solutions_to
from grade_helpers import (HANG_GUARD, JUDGE_START, _grade, _rows, _users, needs_bwrap, needs_root_linux,
                           needs_solutions)

TEST_TIMEOUT = 15  # seconds: the most any test of the class may take (the calibrated limits are lower)
STUDENT_TIMEOUT = 200  # seconds: the grader's --timeout, one student's whole run (the class takes 4-5 min on 2 cores)
JOBS = 2
LOOP_MARGIN = JUDGE_START  # a student who loops everywhere: the sum of its tests' limits + this (its judge's start)
# The whole class, the most it may take: the grader's own bounds (each student's --timeout, two at a time, and a
# judge's start), after the calibration. Not a constant: the time it takes is shown by benchmarks/grade_class.py.
CLASS_BOUND = -(-len(EXPECTED) // JOBS) * (STUDENT_TIMEOUT + JUDGE_START)

# The class is graded in the module fixture: minutes, more on a busy machine (see grade_helpers.HANG_GUARD)
pytestmark = pytest.mark.timeout(HANG_GUARD)


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
    done, seconds = _grade(paths["submissions"], paths["out"], "--jobs", str(JOBS), "--timeout", str(STUDENT_TIMEOUT),
                           "--test-timeout", str(TEST_TIMEOUT), "--tests", str(paths["hidden"]), limit=HANG_GUARD)
    copies_there = all((c / "ex00_warmup.py").exists() for c in copies)
    return {**paths, "done": done, "seconds": seconds, "before": before, "service": service,
            "copies_there": copies_there}


@needs_solutions
@needs_root_linux
@needs_bwrap
def test_class_is_graded_in_bounded_time_with_one_row_per_student(graded_class):
    done = graded_class["done"]
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _rows(graded_class["out"])
    calibration = json.loads((graded_class["out"] / "time_limits.json").read_text())
    # the calibration, or waiting for another grader's (the Gradescope package's tests calibrate ex00 too)
    bound = CLASS_BOUND + calibration["reference_seconds"] + JUDGE_START
    assert graded_class["seconds"] < bound, f"grading took {graded_class['seconds']:.0f} s, more than {bound:.0f} s"
    slowest = max(rows.values(), key=lambda row: float(row["seconds"]))
    assert float(slowest["seconds"]) <= STUDENT_TIMEOUT + JUDGE_START, slowest  # each student within --timeout
    assert set(rows) == set(EXPECTED)
    assert list(rows["correct"])[:10] == ["student", "status", "ex00", "ex00_possible", "ex00_hidden",
                                          "ex00_hidden_possible", "total", "possible", "not graded", "isolation"]
    assert "protections:" in done.stderr and "a user of its own" in done.stderr and "allow-list" in done.stderr
    # one short line says the limits; each test's is in the table of time_limits.json
    line = next(line for line in done.stderr.splitlines() if line.startswith("[grade] time limits: "))
    assert line.startswith("[grade] time limits: 5 tests, ") and line.endswith("time_limits.json"), line
    assert len(line) < 400, line
    table = json.loads((graded_class["out"] / "time_limits.json").read_text())["tests"]
    assert len(table) == 5 and all(row["limit_seconds"] <= TEST_TIMEOUT for row in table), table


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
    assert float(row["ex00_hidden"]) == hidden[0]["score"] and float(row["ex00_hidden_possible"]) == 1
    assert float(row["ex00"]) + float(row["ex00_hidden"]) == total and float(row["ex00_possible"]) == 7
    assert row["isolation"] == "bwrap" and results["extra_data"]["isolation"] == "bwrap"
    feedback = (graded_class["out"] / student / "feedback.md").read_text()
    assert f"**{total:g} / 8 points**" in feedback


def _messages(graded_class, student: str) -> dict[str, str]:
    results = json.loads((graded_class["out"] / student / "results.json").read_text())
    return {t["name"]: t["output"] for t in results["tests"] if t["visibility"] == "visible"}


@needs_solutions
@needs_root_linux
@needs_bwrap
def test_hangs_are_killed_at_the_test_timeout_and_exits_are_failures(graded_class):
    # The first test of a looping function stops at its limit; its later tests fail at once (grading.loops).
    for student, function in (("infinite_loop", "all_reduce_mean"), ("ignores_signals", "shard_range")):
        messages = [m for n, m in _messages(graded_class, student).items() if function in n]
        assert "Timeout" in messages[0] and f"{function} (line" in messages[0], messages
        assert all(f"{function} ran out of time in test_" in m for m in messages[1:]), messages
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
    loops = list(_messages(graded_class, "loops_everywhere").values())
    # shard_range's first test stops at its limit, its second fails at once; all_reduce_mean's first stops at its
    # limit after a loop; then two loops in ex00: its last test is not run (grading.loops)
    assert "Timeout" in loops[0] and "reference solution's time" in loops[0], loops
    assert "shard_range ran out of time in test_" in loops[1], loops
    assert "Timeout" in loops[2] and "all_reduce_mean (line" in loops[2], loops
    assert all("not run, because 2 of this exercise's tests ran out of time" in m for m in loops[3:]), loops
    assert "ran out of time in ex00 (shard_range, all_reduce_mean)" in _rows(graded_class["out"])["loops_everywhere"][
        "detail"]
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
def test_opening_files_outside_the_allow_list_is_flagged_even_when_it_fails(graded_class):
    """The copier tries the course's solutions: it fails in the sandbox, and is in the instructor's report. Honest
    students open nothing outside (no false alarms). (The vandal writes in /tmp: the sandbox's own, allowed.)"""
    rows = _rows(graded_class["out"])
    flagged = {name for name, row in rows.items() if int(row["opened outside"])}
    assert "copier" in flagged, rows
    assert not flagged & {"correct", "partial", "untouched", "infinite_loop", "sys_exit", "memory_hog"}, flagged
    copier = json.loads((graded_class["out"] / "copier" / "results.json").read_text())["extra_data"]
    assert any(line.startswith("opened ") and line.endswith("solutions/ex00_warmup.py")
               for line in copier["opened_outside_allow_list"]), copier
    summary = (graded_class["out"] / "summary.md").read_text()
    flagged_part = summary.split("## Files opened outside the allow-list", 1)[1]
    assert "| copier | bwrap |" in flagged_part and "| correct |" not in flagged_part
    assert "copier: FLAGGED (bwrap)" in graded_class["done"].stdout


@needs_solutions
@needs_root_linux
@needs_bwrap
def test_the_class_summary_says_which_tests_were_hardest(graded_class):
    summary = (graded_class["out"] / "summary.md").read_text()
    assert f"| ok | {len(EXPECTED)} |" in summary and "| timeout | 0 |" in summary
    totals = sorted(total for _, total in EXPECTED.values())
    median = (totals[len(totals) // 2] + totals[(len(totals) - 1) // 2]) / 2
    total = next(line for line in summary.splitlines() if line.startswith("| total |"))
    assert [cell.strip() for cell in total.split("|")][2:5:2] == ["8", f"{median:g}"], total
    with open(graded_class["out"] / "summary.csv", newline="") as handle:
        tests = list(csv.DictReader(handle))
    rates = [float(t["pass rate"]) for t in tests]
    assert len(tests) == 5 and rates == sorted(rates), tests
    assert [t["hidden"] for t in tests].count("yes") == 1


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


def _outcome(name: str, points: float, outcome: str = "passed", not_graded: str | None = None,
             message: str = "") -> TestOutcome:
    return TestOutcome(f"tests/test_ex01_x.py::{name}", points, outcome, message, not_graded)


def test_a_perfect_score_lists_gpu_tests_apart_from_what_went_wrong(tmp_path):
    gpu = "needs 2 CUDA GPUs; this machine has 0"
    perfect = Result("ann", "ok", "", [_outcome("a", 2), _outcome("b", 3, "skipped", gpu, gpu)], isolation="bwrap")
    write_feedback(perfect, tmp_path / "perfect.md")
    text = (tmp_path / "perfect.md").read_text()
    assert "**2 / 2 points**" in text and "What went wrong" not in text
    assert NOT_GRADED_HEADING in text and f"* ex01 ({gpu}): b" in text.split(NOT_GRADED_HEADING, 1)[1]
    failing = Result("bob", "ok", "", [_outcome("a", 2, "failed", message="AssertionError: 3 != 4"),
                                       _outcome("b", 3, "skipped", gpu, gpu)], isolation="bwrap")
    write_feedback(failing, tmp_path / "failing.md")
    wrong = (tmp_path / "failing.md").read_text().split("## What went wrong", 1)[1]
    assert "3 != 4" in wrong and gpu not in wrong


def _class_results() -> tuple[list[Result], list[TestOutcome]]:
    expected = [_outcome("easy", 1), _outcome("hard", 2), TestOutcome("tests/hidden/test_ex01_h.py::h", 1),
                TestOutcome("tests/test_ex02_y.py::y", 3)]

    def result(name, passed, status="ok", outside=()):
        tests = [TestOutcome(t.nodeid, t.points, "passed" if t.nodeid.rsplit(":", 1)[-1] in passed else "failed")
                 for t in expected]
        return Result(name, status, "", tests, 1.0, isolation="unshare", outside=list(outside))

    results = [result("ann", {"easy", "hard", "h", "y"}), result("bob", {"easy", "y"}),
               result("cy", {"easy"}, "timeout", ["opened /tmp/copy/solutions/ex01_x.py"]),
               Result("dee", "grader error", "could not read the submission: not a zip file", [], isolation="unshare")]
    return results, expected


def test_the_gradebook_has_points_possible_per_exercise_and_the_isolation(tmp_path):
    results, expected = _class_results()
    write_gradebook(results, expected, tmp_path / "grades.csv")
    rows = _rows(tmp_path)
    assert list(rows["ann"])[:8] == ["student", "status", "ex01", "ex01_possible", "ex01_hidden",
                                     "ex01_hidden_possible", "ex02", "ex02_possible"]
    assert [rows["bob"][c] for c in ("ex01", "ex01_possible", "ex01_hidden", "ex02", "total", "possible")] == \
        ["1", "3", "0", "3", "4", "7"]
    assert (rows["cy"]["isolation"], rows["cy"]["opened outside"], rows["ann"]["opened outside"]) == ("unshare", "1", "0")
    assert rows["dee"]["ex01"] == rows["dee"]["ex01_possible"] == rows["dee"]["total"] == ""
    write_results_json(results[2], tmp_path / "results.json")
    extra = json.loads((tmp_path / "results.json").read_text())["extra_data"]
    assert extra == {"isolation": "unshare", "opened_outside_allow_list": ["opened /tmp/copy/solutions/ex01_x.py"],
                     "seconds_per_exercise": {"ex01": 0.0, "ex02": 0.0}}  # hidden tests count in their exercise


def test_the_class_summary_sorts_tests_hardest_first_with_points_per_exercise(tmp_path):
    results, expected = _class_results()
    assert [(t.name, t.passed, t.graded) for t in pass_rates(results)] == [
        ("ex01: hard", 1, 3), ("ex01 hidden: h", 1, 3), ("ex02: y", 2, 3), ("ex01: easy", 3, 3)]
    write_summary(results, expected, tmp_path)
    text = (tmp_path / "summary.md").read_text()
    assert "| ok | 2 |" in text and "| timeout | 1 |" in text and "| grader error | 1 |" in text
    assert "| ex01 | 3 | 1.67 | 1 | 1 of 3 |" in text  # ann 3, bob 1, cy 1 of 3; dee is not counted
    assert "| ex02 | 3 | 2 | 3 | 2 of 3 |" in text and "| total | 7 | 4 | 4 | 1 of 3 |" in text
    hardest = text.split("## Tests, hardest first", 1)[1]
    assert hardest.index("ex01: hard") < hardest.index("ex02: y") < hardest.index("ex01: easy")
    assert "| cy | unshare | 1 / 7 | `opened /tmp/copy/solutions/ex01_x.py` |" in text
    assert "unshare: the fallback" in text and "* dee: grader error: could not read the submission" in text
    with open(tmp_path / "summary.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["test"], r["pass rate"]) for r in rows][0] == ("tests/test_ex01_x.py::hard", "0.333")


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
