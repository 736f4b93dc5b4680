"""`check("ex01")`: grade your exercise from a notebook, with a table of tests and points (notebook 00).

The tests run in a separate pytest process against exercises/ (or `target=`), so a mistake in
your code cannot hang or crash the notebook's kernel. Each test shows as it finishes, and a test
that takes long says how long it may take. Each test gets the grader's time limit (4 × the reference
solution's time, at least 3 s, as the instructor's grader computes it); check lets it run twice that
long, and a test that passes only in that extra time is shown as "too slow" and earns nothing here,
as it would earn nothing when graded. Where your code raised, the file, line and your own frames of
the traceback show once under the table. `load_exercise("ex01")` imports your file as it is now, to
try a function before checking it.

    python3 course.py check ex01 [--target solutions] [-v]   the same in a terminal (-v: whole messages)
    python3 course.py check --record-reference-times [ex01]  (course developers) time the reference
                                                             solutions into tests/reference_times.json
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from course_lib import paths, stopping
from course_lib.tables import plural
from course_lib.grading import GRADED_RUN_ENV, ONE_CORE_PER_RANK, PLUGIN_OPTIONS, time_rule
from course_lib.grading.results import TestOutcome, read_report

# This module runs the tests; beside it, check_result.py is what they came to (points, rows, messages),
# check_display.py its text and HTML tables and the progress bar, check_failures.py what a failure's message says.
from course_lib.check_display import NOTEBOOK_WIDTH, BarProgress, Progress, in_notebook  # noqa: F401 (re-exported)
from course_lib.check_failures import smallest_failing_input  # noqa: F401 (re-exported)
from course_lib.check_result import CheckResult

__all__ = ["check", "run_check", "load_exercise", "CheckResult", "TimeRule", "record_reference_times"]

REFERENCE_TIMES = paths.TESTS / "reference_times.json"  # each graded test's time with the reference solution
GRACE = 2.0  # check stops a test at this many times the grader's limit, so a slow answer shows how slow it is


def load_exercise(exercise: str):
    """Your `exercises/exNN_*.py` as it is now on disk, freshly imported (notebook 00).

    Call it again after each edit. The module is also sent by value to ranks started with
    `launch`, so they run your latest code too.
    """
    import cloudpickle

    from course_lib.grading.runner import exercise_path, load_exercise_file

    module = load_exercise_file(exercise_path(exercise, paths.EXERCISES))
    cloudpickle.register_pickle_by_value(module)
    return module


# ------------------------------------------------------------------------------------------------ time limits


@dataclass
class TimeRule:
    """The grader's time limit of each test, from the reference solution's time (notebook 00).

    The rule and its numbers are the instructor's grader's own (course_lib/grading/time_rule.py); the
    reference times were measured by grading the reference solutions
    (tests/reference_times.json, written by `python3 course.py check --record-reference-times`).
    """

    factor: float
    floor: float
    ceiling: float
    reference: dict[str, float] = field(default_factory=dict)  # nodeid -> the reference solution's seconds
    measured_on: str = ""

    @classmethod
    def load(cls, path: str | os.PathLike | None = REFERENCE_TIMES) -> "TimeRule":
        data = {}
        if path is not None:
            try:
                data = json.loads(Path(path).read_text())
            except (OSError, ValueError):
                data = {}
        return cls(time_rule.FACTOR, time_rule.FLOOR, time_rule.CEILING, dict(data.get("durations", {})),
                   data.get("measured_on", ""))

    def grader_limit(self, nodeid: str) -> float | None:
        """The grader's limit for this test, in seconds; None where no reference time was recorded for it."""
        if nodeid not in self.reference:
            return None
        limits = time_rule.calibrated_limits({nodeid: self.reference[nodeid]}, self.factor, self.floor, self.ceiling)
        return limits[nodeid]

    def stop_after(self, nodeid: str) -> float:
        """Where check stops the test: GRACE × the grader's limit, at most the grader's ceiling (without a
        reference time, the ceiling, which is what the grader gives a test it did not calibrate)."""
        limit = self.grader_limit(nodeid)
        return self.ceiling if limit is None else round(min(self.ceiling, GRACE * limit), 1)

    def note(self) -> str:
        measured = f" (reference times measured on {self.measured_on})" if self.measured_on else ""
        return (f"the grader gives each test {self.factor:g} × the reference solution's time, at least "
                f"{self.floor:g} s" + measured)


# ------------------------------------------------------------------------------------------------ running pytest


def check(exercise: str, target: str = "exercises", timeout: float = 600.0) -> None:
    """Run the graded tests of `exercise` (e.g. "ex01") against your files and show a table of points (notebook 00)."""
    progress = BarProgress(exercise, notebook=in_notebook())
    progress.show(run_check(exercise, target, timeout, progress=progress))


def _test_files(exercise: str) -> list[Path]:
    tests = sorted(paths.TESTS.glob(f"test_{exercise}_*.py"))
    if not tests:
        raise ValueError(f"no tests for {exercise!r}; exercises with tests: {', '.join(known_exercises()) or 'none'}")
    return tests


def known_exercises() -> list[str]:
    """The exercises that have graded tests: ex00, ex01, ..."""
    return sorted({p.name.split("_")[1] for p in paths.TESTS.glob("test_ex*_*.py")})


def run_check(exercise: str, target: str = "exercises", timeout: float = 600.0, *, progress: Progress | None = None,
              reference_times: str | os.PathLike | None = REFERENCE_TIMES, select: str | None = None) -> CheckResult:
    """Run the graded tests of `exercise` against `target` and return the result without showing it (notebook 00).

    select: a pytest -k expression, to run only some of the tests.
    """
    tests = _test_files(exercise)
    rule = TimeRule.load(reference_times)
    limits = {nodeid: rule.stop_after(nodeid) for nodeid in rule.reference}
    after_a_loop = {nodeid: round(min(rule.ceiling, GRACE * seconds), 1) for nodeid, seconds in
                    time_rule.limits_after_a_loop(rule.reference, rule.factor, rule.ceiling).items()}
    folder = paths.ROOT / target if target in {"exercises", "solutions"} else Path(target).resolve()
    report, output = _run_pytest(tests, target, limits, rule.ceiling, timeout, progress or Progress(),
                                 lambda done: CheckResult(exercise, done, rule=rule, target=folder), select,
                                 after_a_loop)
    if report is None or (not report.tests and report.exitstatus is None):
        raise RuntimeError(f"pytest did not report any result for {exercise}; its output:\n{output[-3000:]}")
    return CheckResult(exercise, list(report.tests.values()), output, rule, folder)


def _pytest_env() -> dict[str, str]:
    """check's pytest: the graded runs' environment; its ranks, the only graded ones here, keep to a core each."""
    return {**os.environ, **GRADED_RUN_ENV, ONE_CORE_PER_RANK: "1", **stopping.dies_with_me()}


def _run_pytest(tests: list[Path], target: str, limits: dict[str, float], ceiling: float, timeout: float,
                progress: Progress, result_of, select: str | None = None, after_a_loop: dict[str, float] | None = None):
    """Run pytest on `tests` with these limits (and `after_a_loop`, the limits once a test of the exercise ran out
    of time: grading.loops), telling `progress` as tests start and finish; (report, output)."""
    with tempfile.TemporaryDirectory() as scratch:
        report_path, limits_path = Path(scratch) / "report.jsonl", Path(scratch) / "limits.json"
        after = {time_rule.AFTER_A_LOOP: after_a_loop} if after_a_loop else {}
        limits_path.write_text(json.dumps({**limits, **after}))
        # --tb=native: pytest's own styles parse a test file again for each failed test (the grader's judge too)
        command = [sys.executable, "-m", "pytest", *map(str, tests), "--target", str(target), "-q", "--tb=native",
                   "--course-report", str(report_path), "-p", "no:cacheprovider",
                   "--test-timeouts", str(limits_path), "--timeout", f"{ceiling:g}", "-o", "timeout_func_only=true",
                   "--exit-fast", *PLUGIN_OPTIONS]
        if select:
            command += ["-k", select]
        with open(Path(scratch) / "output.txt", "w+", encoding="utf-8", errors="replace") as log:
            # A session of its own: its ranks too are stopped with it. It dies with this process, even SIGKILLed
            # (a kernel that JupyterLab kills while check runs in it).
            process = subprocess.Popen(command, cwd=paths.ROOT, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True,
                                       env=_pytest_env())
            note = ""
            try:
                note = _follow(process, report_path, limits, ceiling, timeout, progress, result_of)
            finally:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                progress.close()
            log.seek(0)
            output = log.read() + note
        return read_report(report_path), output


def _follow(process, report_path: Path, limits: dict[str, float], ceiling: float, timeout: float,
            progress: Progress, result_of) -> str:
    """Read the report's lines as the plugin appends them, until pytest ends; '' or why it was stopped."""
    deadline = time.monotonic() + timeout
    offset, pending, done = 0, "", []
    running, since = None, 0.0
    while True:
        ended = process.poll() is not None
        try:
            with open(report_path, encoding="utf-8") as stream:
                stream.seek(offset)
                chunk = stream.read()
                offset = stream.tell()
        except OSError:
            chunk = ""
        pending += chunk
        *lines, pending = pending.split("\n")
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "collected" in record:
                progress.collected(len(record["collected"]))
            elif "started" in record:
                running, since = record["started"], time.monotonic()
                progress.started(running, limits.get(running, ceiling))
            elif "test" in record:
                done.append(TestOutcome.from_dict(record["test"]))
                running = None
                progress.finished(done[-1], result_of(list(done)))
        if ended:
            return ""
        if time.monotonic() > deadline:
            return f"\nthe tests did not finish within {timeout:g} s and were stopped"
        if running is not None:
            progress.running(running, time.monotonic() - since, limits.get(running, ceiling))
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=0.5)  # a new line is read within 0.5 s; pytest's end at once



# ------------------------------------------------------------------------------------------------ reference times


def record_reference_times(exercises: list[str] | None = None, path: str | os.PathLike = REFERENCE_TIMES) -> dict:
    """(course developers) Grade solutions/ as check does and write each graded test's time to `path`.

    Run it on the course's CI machine after changing a test or a solution; the times of other exercises in the
    file are kept. Every graded test of the solutions must pass.
    """
    import platform
    from datetime import date

    if not paths.SOLUTIONS.is_dir():
        raise SystemExit("no solutions/ here: the reference times are recorded from the reference solutions")
    tests = [f for exercise in (exercises or known_exercises()) for f in _test_files(exercise)]
    rule = TimeRule.load(None)
    report, output = _run_pytest(tests, "solutions", {}, rule.ceiling, 3600.0, Progress(), lambda done: None)
    graded = [t for t in (report.tests.values() if report else []) if t.points is not None]
    failed = [t.nodeid for t in graded if t.outcome not in ("passed", "skipped")]
    if failed or not graded:
        raise SystemExit(f"the reference solutions must pass every graded test (failed: {failed or 'all'}); "
                         f"pytest's output ends with:\n{output[-3000:]}")
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        data = {}
    durations = {k: v for k, v in data.get("durations", {}).items()
                 if not any(f"test_{e}_" in k for e in exercises or known_exercises())}
    durations.update({t.nodeid: t.duration for t in graded if t.outcome == "passed"})
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = "?"
    data = {"about": "each graded test's time with the reference solutions, for check's time limits; written by "
                     "python3 course.py check --record-reference-times",
            "measured_on": f"{plural(os.cpu_count() or 1, 'core')}, {platform.machine()}, "
                           f"Python {platform.python_version()}, torch {torch_version}, {date.today().isoformat()}",
            "durations": dict(sorted(durations.items()))}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")
    return data


# ------------------------------------------------------------------------------------------------ command line


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python3 course.py check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exercise", nargs="?", help="the exercise to check, e.g. ex01")
    parser.add_argument("--target", default="exercises",
                        help="what to check: exercises (default), solutions, or a folder of exNN_*.py files")
    parser.add_argument("-v", "--verbose", action="store_true", help="whole messages, not only their first line")
    parser.add_argument("-k", dest="select", metavar="EXPRESSION",
                        help="only the tests whose names match, as pytest's -k (e.g. -k ring)")
    parser.add_argument("--reference-times", default=str(REFERENCE_TIMES), metavar="FILE",
                        help="the reference solutions' time of each test (default: tests/reference_times.json)")
    parser.add_argument("--record-reference-times", action="store_true",
                        help="(course developers) grade solutions/ and write each test's time to --reference-times")
    options = parser.parse_args(argv)
    known = known_exercises()
    if options.exercise is not None and options.exercise not in known:
        parser.error(f"no exercise {options.exercise!r}; the exercises are {', '.join(known) or 'none'}")
    if options.record_reference_times:
        data = record_reference_times([options.exercise] if options.exercise else None, options.reference_times)
        print(f"{plural(len(data['durations']), 'reference time')} written to {options.reference_times}")
        return 0
    if options.exercise is None:
        parser.error(f"say which exercise to check: {', '.join(known) or 'none'}")
    progress = BarProgress(options.exercise, notebook=False)
    stopping.stop_like_ctrl_c()  # SIGTERM too stops the tests and every process they started
    try:
        result = run_check(options.exercise, options.target, progress=progress,
                           reference_times=options.reference_times, select=options.select)
    except KeyboardInterrupt:
        print(f"\n{options.exercise}: stopped; the tests did not finish", file=sys.stderr)
        return 130
    print(result.format(verbose=options.verbose))
    return 0 if result.all_passed else 1


if __name__ == "__main__":
    sys.exit(main())
