"""The worker pool of the course's own checks: graded pytest runs in warm worker processes (issue 12).

The wrong-answer check (wrong_answers.py) and the mutation score (mutants.py) both grade many variants of a
reference solution, each the only file of a target folder, on its exercise's graded tests. Starting pytest,
torch and the ranks' fork server for each would cost seconds a variant, so `run_in_workers` starts a few
worker processes, each of which imports torch and starts the fork server once and then runs pytest
in-process for one job after another, taken from a queue folder (`worker`). A worker is started as
`python -m course_lib.instructor.wrong_answers --worker QUEUE`, under the Hypothesis profile `selfcheck`
(WORKER_ENVIRONMENT: no shrinking, as only a failure counts), and a test stops at its first failing
parametrization. `solution_of` and `tests_of` find the exercise's solution and tests the variants grow from.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from course_lib import stopping

__all__ = ["GradingJob", "JobResult", "WORKER_ENVIRONMENT", "run_in_workers", "worker", "default_jobs",
           "solution_of", "tests_of"]


def solution_of(root: Path, exercise: str) -> Path | None:
    """The reference solution of `exercise` under root/solutions/ (ex04 -> ex04_*.py), or None."""
    matches = sorted((root / "solutions").glob(f"{exercise}_*.py"))
    return matches[0] if matches else None


def tests_of(root: Path, exercise: str) -> Path | None:
    """The graded test file of `exercise` under root/tests/ (ex04 -> test_ex04_*.py), or None."""
    matches = sorted((root / "tests").glob(f"test_{exercise}_*.py"))
    return matches[0] if matches else None


class _StopAfterFirstFailure:
    """pytest plugin: once one parametrization of a test function has failed, skip the rest of that function.

    A wrong answer has lost its points on that test as soon as one parametrization fails; the others would
    only cost time (each distributed one launches ranks).
    """

    def __init__(self):
        self.failed: set[str] = set()

    def pytest_runtest_setup(self, item):
        import pytest

        if item.nodeid.split("[", 1)[0] in self.failed:
            pytest.skip("an earlier parametrization of this test already failed")

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed.add(report.nodeid.split("[", 1)[0])


@dataclass
class GradingJob:
    """One graded pytest run for a worker process: pytest's arguments (test ids, --target...) and its report file."""

    args: list[str]
    report: Path


@dataclass
class JobResult:
    """How a GradingJob ended: seconds is None when it never finished (its worker stopped, or time ran out)."""

    seconds: float | None = None
    timed_out: bool = False  # it ran past the time limit of one job, and its worker was killed
    log: Path | None = None  # the log of the worker that ran it

    def log_tail(self, lines: int = 3) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])


WORKER_ENVIRONMENT = {"COURSE_HYPOTHESIS": "selfcheck"}  # the Hypothesis profile without shrinking (grading.plugin)
# no:unraisableexception: that plugin's gc.collect() calls, with torch loaded, cost a second per job on a busy machine.
_PYTEST_FLAGS = ["-q", "-p", "no:cacheprovider", "-p", "no:unraisableexception",
                 "-W", "ignore::pytest.PytestAssertRewriteWarning"]


def _write_atomically(path: Path, text: str) -> None:
    """Write a marker file whole or not at all (the parent polls for it)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def _read_number(path: Path) -> float | None:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


def _kill_worker(process: subprocess.Popen) -> None:
    """SIGKILL a worker and its process group (it was started in a session of its own), then reap it."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            process.kill()
    process.wait()


class _Pool:
    """The worker processes of one run_in_workers call, the queue folder they take jobs from, and the results."""

    def __init__(self, jobs: list[GradingJob], root: Path, scratch: Path, workers: int, python: str,
                 on_done: Callable[[int, JobResult], None] | None):
        self.jobs, self.root, self.scratch, self.python, self.on_done = jobs, root, scratch, python, on_done
        self.queue, self.running = scratch / "queue", scratch / "running"
        self.queue.mkdir(parents=True)
        self.running.mkdir()
        for index, job in enumerate(jobs):
            (self.queue / f"{index:06d}.json").write_text(json.dumps({"args": job.args, "report": str(job.report)}))
        self.size = min(max(1, workers), len(jobs))  # the workers kept running while jobs wait
        self.most = len(jobs) + 2 * max(1, workers)  # the workers started in all, at most
        self.results: dict[int, JobResult] = {}
        self.env = {**os.environ, **WORKER_ENVIRONMENT, **stopping.dies_with_me()}  # a worker dies with this process
        self.alive: list[tuple[subprocess.Popen, Path]] = []
        self.seen_log: dict[int, Path] = {}  # the log of the worker seen running each job
        self.started_workers = 0

    def start_worker(self) -> None:
        log = self.scratch / f"worker{self.started_workers}.log"
        self.started_workers += 1
        with open(log, "w") as out:
            process = subprocess.Popen([self.python, "-m", "course_lib.instructor.wrong_answers", "--worker",
                                        str(self.queue)], cwd=self.root, stdout=out, stderr=subprocess.STDOUT,
                                       env=self.env, start_new_session=True)
        self.alive.append((process, log))

    def finish(self, index: int, result: JobResult) -> None:
        self.results[index] = result
        if self.on_done is not None:
            self.on_done(index, result)

    def claimed_by(self, process: subprocess.Popen) -> list[tuple[int, Path]]:
        return [(int(p.stem.split("-", 1)[1]), p) for p in self.running.glob(f"{process.pid}-*.json")]

    def kill_overdue(self, job_timeout: float | None) -> None:
        """Note which worker runs which job, and kill a worker whose job has run past `job_timeout` (timed out)."""
        for process, log in list(self.alive):
            for index, claim in self.claimed_by(process):
                self.seen_log[index] = log
                began = _read_number(Path(self.jobs[index].report.as_posix() + ".started"))
                if (job_timeout is not None and index not in self.results and began is not None
                        and time.time() - began > job_timeout
                        and not Path(self.jobs[index].report.as_posix() + ".seconds").exists()):
                    _kill_worker(process)
                    claim.unlink(missing_ok=True)
                    self.finish(index, JobResult(time.time() - began, timed_out=True, log=log))

    def collect_finished(self) -> None:
        for index, job in enumerate(self.jobs):
            seconds = _read_number(Path(job.report.as_posix() + ".seconds"))
            if index not in self.results and seconds is not None:
                self.finish(index, JobResult(seconds, log=self.seen_log.get(index)))

    def reap_dead(self) -> None:
        for process, log in list(self.alive):
            if process.poll() is not None:
                self.alive.remove((process, log))
                for index, claim in self.claimed_by(process):  # it died inside a job (not killed by kill_overdue)
                    claim.unlink(missing_ok=True)
                    if index not in self.results:
                        self.finish(index, JobResult(None, log=log))

    def top_up(self) -> None:
        """Replace the workers that were killed or died while jobs are waiting (a bounded number of times)."""
        while len(self.alive) < self.size and any(self.queue.glob("*.json")) and self.started_workers < self.most:
            self.start_worker()

    def stop(self) -> None:
        for process, _ in self.alive:
            _kill_worker(process)

    def all_results(self) -> list[JobResult]:
        for index, job in enumerate(self.jobs):
            if index not in self.results:
                self.results[index] = JobResult(_read_number(Path(job.report.as_posix() + ".seconds")),
                                                log=self.seen_log.get(index))
        return [self.results[i] for i in range(len(self.jobs))]


def run_in_workers(jobs: list[GradingJob], root: Path, scratch: Path, workers: int = 2, python: str = sys.executable,
                   job_timeout: float | None = None, timeout: float = 1800,
                   on_done: Callable[[int, JobResult], None] | None = None) -> list[JobResult]:
    """Run each job's pytest in `workers` worker processes that take jobs from a queue, one after another.

    A worker imports torch and starts the ranks' fork server once, then runs pytest in-process for each job
    it takes. A job that runs longer than `job_timeout` seconds has its worker killed (with the fork server
    and ranks under it) and counts as timed out; a fresh worker takes over the queue. Whatever has not
    finished after `timeout` seconds in all is left with seconds None. `on_done(index, result)` is called as
    each job ends. Results come back in the order of `jobs`.
    """
    pool = _Pool(jobs, root, scratch, workers, python, on_done)
    for _ in range(pool.size):
        pool.start_worker()
    try:
        deadline = time.monotonic() + timeout
        while len(pool.results) < len(jobs) and time.monotonic() < deadline and pool.alive:
            time.sleep(0.3)
            pool.kill_overdue(job_timeout)
            pool.collect_finished()
            pool.reap_dead()
            pool.top_up()
    finally:  # also when interrupted (Ctrl-C): no worker outlives the check
        pool.stop()
    return pool.all_results()


def worker(queue: Path) -> int:
    """Take jobs from the queue folder one at a time and run pytest in this one process for each: torch and the
    ranks' fork server start only once. A job is claimed by renaming its file into ../running/<pid>-<n>.json."""
    stopping.die_with_parent_if_asked()  # killed with the check (run_in_workers), whatever stops it
    import pytest
    import torch  # noqa: F401  what every graded test imports: once, before the first job's clock starts

    from course_lib.dist.forkserver import start_fork_server

    start_fork_server()  # likewise the fork server the ranks come from (run() would start it at the first launch)
    running, empty = queue.parent / "running", queue.parent / "warm-up"
    empty.mkdir(exist_ok=True)
    # A first pytest run on an empty folder imports (and rewrites) every pytest plugin: seconds, also not a job's.
    pytest.main([str(empty), "--collect-only", "-p", "course_lib.grading.plugin", *_PYTEST_FLAGS])
    while True:
        claimed = None
        for path in sorted(queue.glob("*.json")):
            mine = running / f"{os.getpid()}-{path.stem}.json"
            try:
                os.rename(path, mine)
            except FileNotFoundError:  # another worker took it first
                continue
            claimed = mine
            break
        if claimed is None:
            return 0
        job = json.loads(claimed.read_text())
        _write_atomically(Path(job["report"] + ".started"), f"{time.time():.3f}")
        started = time.monotonic()
        pytest.main([*job["args"], "--course-report", job["report"], *_PYTEST_FLAGS],
                    plugins=[_StopAfterFirstFailure()])
        sys.stdout.flush()
        _write_atomically(Path(job["report"] + ".seconds"), f"{time.monotonic() - started:.1f}")
        claimed.unlink(missing_ok=True)


def default_jobs() -> int:
    """The workers a check starts unless told: 2 to 4, as the machine's cores allow."""
    from course_lib.devices import usable_cores

    return max(2, min(4, usable_cores()))
