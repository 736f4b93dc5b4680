"""The judge: a trusted copy of the tests, and how one pytest process per student runs them.

The judge never imports a student's code: its tests reach it through course_lib.grading.runner, in
child processes confined as `--confine` says (forked in the student's sandbox). It writes its verdicts, one JSON line per finished
test, to a report in a folder only the grader can write, so a judge killed at the time limit still
counts the tests it finished.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.grading import GRADED_RUN_ENV, PLUGIN_OPTIONS
from course_lib.grading.results import Report, TestOutcome, read_report
from course_lib.paths import ROOT, TESTS

# The judge's own configuration: nothing from a pytest.ini or conftest.py outside its folder counts.
PYTEST_INI = "[pytest]\naddopts =\n"


@dataclass
class Judge:
    """The trusted test tree shared by every student's judge, the test files it runs, and their graded tests."""

    folder: Path
    tests: list[str]
    expected: list[TestOutcome] = field(default_factory=list)  # every graded test, collected once


def build_judge(work: Path, hidden: Path | None, exercises: list[str] | None) -> Judge:
    """Copy the course's graded tests (and the hidden ones) into a folder only the grader can read."""
    folder = work / "judge"
    folder.mkdir(mode=0o700)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")

    def leave_out(directory, names):
        return set(ignore(directory, names)) | ({"course", "hidden"} if Path(directory) == TESTS else set())

    shutil.copytree(TESTS, folder / "tests", ignore=leave_out)
    if hidden is not None:
        shutil.copytree(hidden, folder / "tests" / "hidden", ignore=ignore)
    (folder / "pytest.ini").write_text(PYTEST_INI)
    tests = sorted(str(p.relative_to(folder)) for p in (folder / "tests").glob("test_ex*.py"))
    if hidden is not None:
        tests += sorted(str(p.relative_to(folder)) for p in (folder / "tests" / "hidden").rglob("test_*.py"))
    if exercises:
        tests = [t for t in tests if TestOutcome(t).exercise in exercises]
    return Judge(folder, tests)


def judge_env(home: Path, sandboxed: bool = False) -> dict[str, str]:
    """The judge's environment: only what Python, pytest and CUDA need, a home in the student's scratch folder."""
    keep = ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX",
            "COURSE_HYPOTHESIS")  # the Hypothesis profile graded tests run under (course_lib.grading.plugin)
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(
        PYTHONPATH=str(ROOT),
        PYTHONNOUSERSITE="1",  # nothing a student planted in ~/.local runs in the next judge
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        **GRADED_RUN_ENV,
        HOME=str(home),
        TMPDIR=str(home / "tmp"),
    )
    if sandboxed:
        # Only loopback exists in the sandbox, where gloo's lookup of the host name finds no address: it warns
        # "Unable to resolve hostname" and falls back to loopback. Say so at once.
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def judge_command(judge: Judge, target: Path, report: Path, basetemp: Path, test_timeout: float,
                  confine: Path | None = None, collect_only: bool = False, time_limits: Path | None = None) -> list[str]:
    """The judge's pytest command: --test-timeout for every test, or the calibrated limit in `time_limits`."""
    command = [
        sys.executable, "-m", "pytest", "-c", str(judge.folder / "pytest.ini"), "--rootdir", str(judge.folder),
        "--confcutdir", str(judge.folder), "-p", "no:cacheprovider", "-p", "course_lib.grading.plugin",
        *PLUGIN_OPTIONS,
        "--import-mode=importlib", "--basetemp", str(basetemp), "-o", f"timeout={test_timeout:g}",
        # SIGALRM in the judge's main thread: it raises inside the launcher's wait, which kills the ranks. The
        # thread method would end the whole judge (os._exit) and lose the tests after this one.
        "-o", "timeout_method=signal", "-o", "timeout_func_only=true",  # the test's call: see grading.plugin
        # Python's own tracebacks in the log: pytest's short ones parse a test file again for each failed test (1.5 s
        # of a judge whose every test failed, in five exercises).
        "--tb=native", "--target", str(target), "--course-report", str(report), "-q", "-rN", "--exit-fast",
        *judge.tests,
    ]
    if confine is not None:
        command += ["--confine", str(confine)]
    if time_limits is not None:
        command += ["--test-timeouts", str(time_limits)]
    if collect_only:
        command.append("--collect-only")
    return command


def collect_expected(judge: Judge, work: Path, test_timeout: float) -> list[TestOutcome]:
    """Collect the tests once, against an empty folder: every student is graded on this list."""
    folder = work / "collect"
    (folder / "target").mkdir(parents=True)
    (folder / "tmp").mkdir()
    command = judge_command(judge, folder / "target", folder / "report.jsonl", folder / "basetemp", test_timeout,
                            collect_only=True)
    done = subprocess.run(command, cwd=judge.folder, env=judge_env(folder), capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    report = read_report(folder / "report.jsonl")
    if done.returncode != 0 or report is None or report.collected is None:
        raise SystemExit(f"error: the course's tests could not be collected (pytest exit code {done.returncode}):\n"
                         f"{(done.stdout + done.stderr)[-3000:]}")
    return [t for t in report.collected if t.points is not None]


def classify(returncode: int | None, timed_out: bool, report: Report | None, limit: float) -> tuple[str, str]:
    """The status of one student's grading and a reason: ok, timeout, crashed or grader error."""
    if timed_out:
        return "timeout", f"the time limit per student ({limit:g} s) ran out; the tests not finished count as failed"
    if returncode is not None and returncode < 0:
        known = -returncode in signal.Signals._value2member_map_
        name = signal.Signals(-returncode).name if known else str(-returncode)
        return "crashed", (f"the judge process was killed by {name} (out of memory?); "
                           "the tests not finished count as failed")
    if returncode in (0, 1):
        if report is None or report.exitstatus is None:
            return "grader error", "pytest finished but its report is missing or unreadable"
        return "ok", ""
    meaning = {2: "pytest was interrupted", 3: "pytest hit an internal error", 4: "pytest was called wrongly",
               5: "pytest found no tests"}.get(returncode, f"pytest exited with code {returncode}")
    return "grader error", meaning


def merge(expected: list[TestOutcome], finished: dict[str, TestOutcome], status: str) -> list[TestOutcome]:
    """One row per expected graded test; a test the judge did not finish counts as failed, with the reason."""
    rows = []
    for test in expected:
        got = finished.get(test.nodeid)
        if got is None:
            why = {"timeout": "not run: the time limit per student ran out before this test finished",
                   "crashed": "not run: the grading process crashed before this test finished"}.get(status, "not run")
            got = TestOutcome(test.nodeid, outcome="failed", message=why)
        rows.append(TestOutcome(test.nodeid, test.points, got.outcome, got.message,
                                test.not_graded or got.not_graded, got.duration))
    return rows
