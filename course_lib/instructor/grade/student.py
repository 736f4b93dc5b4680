"""Grading one student: their files in a scratch folder of their own, their own judge process, their row."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from course_lib.grading.confinement import Confinement
from course_lib.grading.results import read_report
from course_lib.instructor.grade.judge import Judge, classify, judge_command, judge_env, merge
from course_lib.instructor.grade.report import Result, write_feedback, write_results_json
from course_lib.instructor.grade.sandbox import Sandbox, kill_user, namespace_prefix
from course_lib.instructor.grade.submissions import SubmissionError, collect_exercise_files

MAX_WRITTEN_FILE = 64 * 2**20  # the largest file a student's code may write


@dataclass
class Settings:
    """What every student's grading in one run shares."""

    out: Path  # where grades.csv and each student's folder go
    work: Path  # the grader's own scratch folder
    judge: Judge
    sandbox: Sandbox
    timeout: float  # seconds for one student's whole run
    test_timeout: float  # seconds for one test
    memory_bytes: int  # address-space limit per student process; 0 for none
    max_processes: int
    hide: list[Path]  # folders the students' processes must not see


_running: dict[int, tuple[subprocess.Popen, int | None]] = {}  # judges now running: stopped if the grader is


def stop_all() -> None:
    """Stop every judge now running (Ctrl-C or SIGTERM in the grader)."""
    for process, uid in list(_running.values()):
        _stop(process, uid)


def _stop(process: subprocess.Popen, uid: int | None) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the fork server and anything else left in the judge's session
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    if uid is not None:
        kill_user(uid)  # ranks and anything they started, wherever they moved
    _running.pop(process.pid, None)


def _scratch_for(home: Path, files: dict[str, bytes], uid: int | None) -> Path:
    """The student's scratch folder: their exercise files, a tmp/, owned by their user."""
    scratch = home / "scratch"
    (scratch / "exercises").mkdir(parents=True)
    (scratch / "tmp").mkdir()
    for file_name, data in files.items():
        (scratch / "exercises" / file_name).write_bytes(data)
    if uid is not None:
        for path in [scratch, scratch / "exercises", scratch / "tmp", *(scratch / "exercises").iterdir()]:
            os.chown(path, uid, uid)
        os.chmod(scratch, 0o700)
    return scratch


def _run_judge(command: list[str], s: Settings, scratch: Path, log_path: Path, uid: int | None) -> int | None:
    """Run the judge; its exit code, or None if the per-student time limit ran out."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=s.judge.folder, env=judge_env(scratch), stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _running[process.pid] = (process, uid)
        try:
            process.wait(timeout=s.timeout)
            return process.returncode
        except subprocess.TimeoutExpired:
            return None
        finally:
            _stop(process, uid)


def grade_one(name: str, entry: Path, slot: int, uid: int | None, s: Settings) -> Result:
    """Grade one submission in its own scratch folder, with its own judge process."""
    started = time.monotonic()
    home = s.work / f"s{slot}-{name}"
    home.mkdir(mode=0o711)
    private = home / "judge"  # the judge's report and log: only the grader can read or write here
    private.mkdir(mode=0o700)
    try:
        files, found_in = collect_exercise_files(entry)
    except (SubmissionError, OSError) as error:
        result = Result(name, "grader error", f"could not read the submission: {error}", [], time.monotonic() - started)
        _write_student(result, s.out / name, None)
        return result
    scratch = _scratch_for(home, files, uid)
    confinement = Confinement(memory_bytes=s.memory_bytes, max_processes=s.max_processes,
                              file_bytes=MAX_WRITTEN_FILE, cwd=str(scratch), uid=uid, gid=uid)
    confinement.to_file(private / "confine.json")
    report_path, log_path = private / "report.jsonl", private / "judge.log"
    command = judge_command(s.judge, scratch / "exercises", report_path, private / "tmp", s.test_timeout,
                            confine=private / "confine.json")
    returncode = _run_judge(namespace_prefix(s.sandbox, s.hide, s.work) + command, s, scratch, log_path, uid)
    report = read_report(report_path)
    status, detail = classify(returncode, returncode is None, report, s.timeout)
    finished = report.tests if report is not None else {}
    if status == "grader error" and not finished:
        detail += ": " + _tail(log_path, 1500)
    tests = merge(s.judge.expected, finished, status) if status != "grader error" or finished else []
    if not files:
        detail = (detail + "; " if detail else "") + "no exNN_*.py files found in the submission"
    result = Result(name, status, detail, tests, time.monotonic() - started, found_in)
    _write_student(result, s.out / name, log_path)
    shutil.rmtree(home, ignore_errors=True)
    return result


def _write_student(result: Result, folder: Path, log_path: Path | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    log = _tail(log_path, 2**20) if log_path is not None else ""  # the judge's output, for the instructor
    (folder / "grading.log").write_text(log + "\n" if log else f"{result.status}: {result.detail}\n")
    write_results_json(result, folder / "results.json")
    write_feedback(result, folder / "feedback.md")


def _tail(path: Path, size: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - size))
            return handle.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
