"""Grading one student: their files in a scratch folder, their own sandbox and judge process, their row."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from course_lib import stopping
from course_lib.grading.confinement import Confinement
from course_lib.grading.results import Report, TestOutcome, read_report
from course_lib.instructor.grade.bwrap import (SandboxSpec, bwrap_argv, readable_paths, write_sandbox_etc,
                                               write_sandboxed_python)
from course_lib.instructor.grade.judge import Judge, classify, judge_command, judge_env, merge
from course_lib.instructor.grade.judge_zygote import JudgeZygote
from course_lib.instructor.grade.memory_cgroup import StudentCgroup
from course_lib.instructor.grade.mount_namespace import namespace_prefix
from course_lib.instructor.grade.report import Result, write_feedback, write_results_json
from course_lib.instructor.grade.sandbox import Isolation
from course_lib.instructor.grade.submissions import SubmissionError, collect_exercise_files
from course_lib.instructor.grade.users import kill_user
from course_lib.paths import ROOT

MAX_WRITTEN_FILE = 64 * 2**20  # the largest file a student's code may write


@dataclass
class Settings:
    """What every student's grading in one run shares."""

    out: Path  # where grades.csv and each student's folder go
    work: Path  # the grader's own scratch folder
    judge: Judge
    isolation: Isolation
    timeout: float  # seconds for one student's whole run
    test_timeout: float  # seconds for a test without a calibrated limit
    memory_bytes: int  # all of one student's processes together (cgroup or watchdog)
    rlimit_as_bytes: int  # address space of each student process; 0 for none (CUDA)
    max_processes: int
    gpu_memory_fraction: float  # of each GPU, per student process (PyTorch's allocator); 0 for none
    hide: list[Path]  # folders the students' processes must not see
    time_limits: Path | None = None  # JSON {nodeid: seconds}: the calibrated limit of each test
    limit_note: str = ""  # how those limits were set, for the students' feedback
    zygote: JudgeZygote | None = None  # where judges are forked from (judge_zygote.py); None: each starts Python


@dataclass
class JudgeRun:
    """What one judge process left: its exit code (None: stopped at the per-student limit), report and log."""

    returncode: int | None
    report: Report | None
    log: Path
    seconds: float
    memory_peak_bytes: int = 0  # from the memory cgroup, where there is one
    outside: list[str] = field(default_factory=list)  # what student code opened (or ran) outside its allow-list


_running: dict[int, tuple[subprocess.Popen, int | None]] = {}  # judges now running: stopped if the grader is


def stop_all() -> None:
    """Stop every judge now running (Ctrl-C or SIGTERM in the grader)."""
    for process, uid in list(_running.values()):
        _stop(process, uid)


def _stop(process: subprocess.Popen, uid: int | None) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the judge and its sandbox (bwrap dies with its parent)
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


def _confinement(home: Path, scratch: Path, uid: int | None, cgroup: StudentCgroup | None,
                 s: Settings) -> Confinement:
    """The student's sandbox and limits, as the judge's ranks will apply them."""
    argv = []
    watch = _watch_folder(home)
    spec = SandboxSpec(read_only=[ROOT / "course_lib"], writable=[scratch], secrets=s.hide)
    if s.isolation.mode == "bwrap":
        spec.etc_folder = write_sandbox_etc(home / "etc", uid)
        # The log of files opened outside the allow-list: the rank opens it before it becomes the student's user.
        argv = bwrap_argv(SandboxSpec(read_only=spec.read_only, writable=[scratch, watch], etc_folder=spec.etc_folder,
                                      secrets=s.hide), root=s.isolation.root, bwrap=s.isolation.bwrap)
    executable = None
    if argv or cgroup is not None:
        executable = str(write_sandboxed_python(home / "judge" / "sandboxed-python", argv,
                                                cgroup.procs_files() if cgroup is not None else []))
    return Confinement(
        rlimit_as_bytes=s.rlimit_as_bytes, max_processes=s.max_processes if uid is not None else 0,
        file_bytes=MAX_WRITTEN_FILE, cwd=str(scratch), uid=uid, gid=uid, fork_server_executable=executable,
        memory_limit_bytes=s.memory_bytes, memory_cgroup=str(cgroup.memory) if cgroup is not None else None,
        memory_cgroup_version=cgroup.version if cgroup is not None else 1,
        memory_watchdog=s.isolation.memory == "watchdog", gpu_memory_fraction=s.gpu_memory_fraction,
        read_allowed=readable_paths(spec, private_tmp=s.isolation.mode == "bwrap") + _package_metadata(),
        read_log=str(watch / READ_LOG),
        traceback_sources=[str(s.judge.folder)],
        host_only=_host_tmp() if s.isolation.mode == "bwrap" else None)


def _host_tmp() -> list[str]:
    """What the host's /tmp holds now: the sandbox's /tmp is its own, so a path there is the host's only if bound."""
    try:
        return sorted(os.path.join("/tmp", name) for name in os.listdir("/tmp"))
    except OSError:
        return []


READ_LOG = "outside.log"


def _package_metadata() -> list[str]:
    """The course's own package metadata beside it (an editable install's), which importlib.metadata reads when
    a library looks up entry points: nothing of the solutions, so not flagged where the fallback shows it."""
    return [str(p) for pattern in ("*.egg-info", "*.dist-info") for p in ROOT.glob(pattern) if p.is_dir()]


def _watch_folder(home: Path) -> Path:
    """A folder only the grader's user can enter, with the empty log the ranks append to (Confinement.read_log)."""
    folder = home / "watch"
    folder.mkdir(mode=0o700)
    (folder / READ_LOG).touch(mode=0o600)
    return folder


def read_outside_log(path: Path, limit: int = 200) -> list[str]:
    """The distinct lines of a student's log of files opened outside the allow-list ('opened PATH', 'ran PROGRAM')."""
    try:
        text = path.read_bytes()[:2**20].decode("utf-8", "replace")
    except OSError:
        return []
    lines = [" ".join(line.split("\t", 1)) for line in text.splitlines() if line.strip()]
    return list(dict.fromkeys(lines))[:limit]


def run_judge(name: str, files: dict[str, bytes], slot: int, uid: int | None, s: Settings) -> JudgeRun:
    """Grade `files` (exNN_*.py by name) with one judge process in a sandbox of their own; keep only its verdicts."""
    started = time.monotonic()
    home = s.work / f"s{slot}-{name}"
    home.mkdir(mode=0o711)
    private = home / "judge"  # the judge's report and log: only the grader can read or write here
    private.mkdir(mode=0o700)
    scratch = _scratch_for(home, files, uid)
    cgroup = (StudentCgroup(s.isolation.cgroup, f"course-grade-{os.getpid()}-{slot}", s.memory_bytes,
                            s.max_processes) if s.isolation.memory == "cgroup" else None)
    try:
        _confinement(home, scratch, uid, cgroup, s).to_file(private / "confine.json")
        report_path, log_path = private / "report.jsonl", private / "judge.log"
        command = judge_command(s.judge, scratch / "exercises", report_path, private / "tmp", s.test_timeout,
                                confine=private / "confine.json", time_limits=s.time_limits)
        prefix = (namespace_prefix(s.isolation.hide_command, s.isolation.root, s.hide, s.work)
                  if s.isolation.mode == "unshare" else [])
        returncode = _run(prefix + command, s, scratch, log_path, uid)
        peak = cgroup.peak_bytes() if cgroup is not None else 0
    finally:
        if cgroup is not None:
            cgroup.remove()
    report = read_report(report_path)
    outside = read_outside_log(home / "watch" / READ_LOG)
    log = s.work / f"{home.name}.log"
    shutil.move(log_path, log)  # the student's folder goes; the log stays for the instructor
    shutil.rmtree(home, ignore_errors=True)
    return JudgeRun(returncode, report, log, time.monotonic() - started, peak, outside)


def _run(command: list[str], s: Settings, scratch: Path, log_path: Path, uid: int | None) -> int | None:
    """Run the judge; its exit code, or None if the per-student time limit ran out."""
    env = {**judge_env(scratch, s.isolation.mode == "bwrap"), **stopping.dies_with_me()}
    pytest_args = command[3:] if command[1:3] == ["-m", "pytest"] else None
    process = None
    if s.zygote is not None and pytest_args is not None:  # forked from the zygote, which has torch imported
        process = s.zygote.start(pytest_args, env, s.judge.folder, log_path)
    if process is None:
        with open(log_path, "wb") as log:
            # A session of its own, killed as a group (_stop); and it dies with the grader, even a SIGKILLed one
            # (its sandbox with it: bwrap --die-with-parent).
            process = subprocess.Popen(command, cwd=s.judge.folder, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
    _running[process.pid] = (process, uid)
    try:
        process.wait(timeout=s.timeout)
        return process.returncode
    except subprocess.TimeoutExpired:
        return None
    finally:
        _stop(process, uid)


def grade_one(name: str, entry: Path, slot: int, uid: int | None, s: Settings) -> Result:
    """Grade one submission in its own scratch folder and sandbox, with its own judge process."""
    started = time.monotonic()
    try:
        files, found_in = collect_exercise_files(entry)
    except (SubmissionError, OSError) as error:
        result = Result(name, "grader error", f"could not read the submission: {error}", [], time.monotonic() - started,
                        isolation=s.isolation.mode)
        _write_student(result, s.out / name, None)
        return result
    return grade_files(name, files, found_in, slot, uid, s, started)


def grade_files(name: str, files: dict[str, bytes], found_in: str, slot: int, uid: int | None, s: Settings,
                started: float | None = None) -> Result:
    """Grade exercise files already read (exNN_*.py name -> bytes); write the student's folder in s.out."""
    started = time.monotonic() if started is None else started
    run = run_judge(name, files, slot, uid, s)
    status, detail = classify(run.returncode, run.returncode is None, run.report, s.timeout)
    finished = run.report.tests if run.report is not None else {}
    if status == "grader error" and not finished:
        detail += ": " + _tail(run.log, 1500)
    tests = merge(s.judge.expected, finished, status) if status != "grader error" or finished else []
    if not files:
        detail = (detail + "; " if detail else "") + "no exNN_*.py files found in the submission"
    if run.report is not None and run.report.looped:
        looped = "; ".join(f"{exercise} ({', '.join(functions)})" for exercise, functions in run.report.looped.items())
        detail = (detail + "; " if detail else "") + f"ran out of time in {looped}"
    result = Result(name, status, detail, _say_time_limits(tests, s), time.monotonic() - started, found_in,
                    isolation=s.isolation.mode, outside=run.outside)
    _write_student(result, s.out / name, run.log)
    run.log.unlink(missing_ok=True)
    return result


def _say_time_limits(tests: list[TestOutcome], s: Settings) -> list[TestOutcome]:
    """A test stopped at its time limit says what the limit was and how it was set."""
    for test in tests:
        if "Timeout (>" in test.message and s.limit_note:
            test.message += f"\n({s.limit_note})"
    return tests


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
