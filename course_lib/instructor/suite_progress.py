"""A progress line for the course's long test runs: tests done, failures so far, and the time left.

    python -m pytest tests -p course_lib.instructor.suite_progress

`python3 course.py test` loads it for its last step, the whole suite (15 minutes on a 2-core machine), which
otherwise shows only pytest's dots. At the start it says how many tests there are; then, at least every
INTERVAL seconds, whether or not a test finished (the grader's class takes minutes), one line such as

    [course] 212 of 603 tests done, 0 failed, 6 min 10 s so far, about 8 min left

The time left adds up the remaining tests' durations from the last run on this machine (kept in
build/test-durations.json), divided among pytest-xdist's workers; without a last run, those recorded on the
course's CI machine (suite_durations.json), and for tests neither knows, the pace so far, saying so. It works
with and without pytest-xdist (in the controller; workers stay quiet).
$COURSE_PROGRESS_INTERVAL and $COURSE_PROGRESS_HISTORY change the interval and the file (the course's tests do).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

INTERVAL = 30.0  # seconds between two progress lines at most
HISTORY = Path(__file__).resolve().parents[2] / "build" / "test-durations.json"
# Where there is no last run (a fresh clone, as CI's): each test's duration in a run of `python3 course.py test` on
# the course's 2-core CI machine with both cores kept busy by two other processes (so the estimate errs long).
RECORDED = Path(__file__).with_name("suite_durations.json")


def _durations(path: Path) -> dict[str, float]:
    try:
        return {k: float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _minutes(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


class SuiteProgress:
    """Counts the finished tests the controller hears of, and says where the run stands."""

    def __init__(self, config, history: Path = HISTORY, interval: float = INTERVAL, clock=time.monotonic,
                 recorded: Path = RECORDED):
        self.config = config
        self.history_path = history
        self.interval = interval
        self.clock = clock
        self.ids: list[str] = []
        self.finished: set[str] = set()
        self.failed: set[str] = set()
        self.durations: dict[str, float] = {}
        self.started = self.last_line = clock()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.written_at = -1  # the width pytest's current line had when a line of ours last ended it
        self.thread: threading.Thread | None = None
        self.history, self.recorded = _durations(history), False
        if not self.history:  # a fresh clone: the durations recorded on the course's CI machine
            self.history, self.recorded = _durations(recorded), True

    # -- what the run tells us --------------------------------------------------------------------------------
    def collected(self, ids: list[str]) -> None:
        if self.ids:
            return
        self.ids = list(ids)
        self.say(f"{len(self.ids)} tests" + (f", in {self.workers()} pytest workers" if self.workers() > 1 else "")
                 + f"; a progress line at least every {self.interval:g} s")
        if self.thread is None and self.interval > 0:
            self.thread = threading.Thread(target=self._heartbeat, name="course-progress", daemon=True)
            self.thread.start()

    def report(self, report) -> None:
        with self.lock:
            self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + float(report.duration or 0)
            if report.failed:
                self.failed.add(report.nodeid)
            if report.when == "teardown" or (report.when == "setup" and report.skipped):
                self.finished.add(report.nodeid)
        if self.clock() - self.last_line >= self.interval and len(self.finished) < len(self.ids):
            self.say(self.line())

    def finish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=2)
        if self.finished:
            try:  # this run's durations, over the last run's for the tests that did not run this time
                self.history_path.parent.mkdir(parents=True, exist_ok=True)
                kept = {} if self.recorded else self.history
                merged = {**kept, **{k: round(v, 3) for k, v in self.durations.items()}}
                self.history_path.write_text(json.dumps(merged, indent=0, sort_keys=True) + "\n")
            except OSError:
                pass

    # -- pytest's hooks (this object is registered as a plugin) ---------------------------------------------------
    def pytest_collection_finish(self, session):
        if not getattr(session.config.option, "numprocesses", None):  # with xdist, the workers collect
            self.collected([item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)  # pytest-xdist's: a worker finished collecting
    def pytest_xdist_node_collection_finished(self, node, ids):
        self.collected(ids)

    def pytest_runtest_logreport(self, report):
        self.report(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        self.finish()

    # -- what it says ---------------------------------------------------------------------------------------
    def workers(self) -> int:
        count = getattr(self.config.option, "numprocesses", None)
        return count if isinstance(count, int) and count > 0 else 1

    def time_left(self) -> str:
        """'about 8 min left', from the last run's durations of the tests not finished, or from the pace so far."""
        left = [i for i in self.ids if i not in self.finished]
        if not left:
            return "finishing"
        known = [self.history[i] for i in left if i in self.history]
        if self.history and len(known) >= len(left) / 2:
            typical = sorted(self.history.values())[len(self.history) // 2]
            work = sum(known) + typical * (len(left) - len(known))
            where = " (at the pace of the course's CI machine, busy: no last run here)" if self.recorded else ""
            return f"about {_minutes(work / self.workers())} left{where}"
        done = len(self.finished)
        if done < len(self.ids) / 5:  # the long tests run first: the pace of the first ones says little
            return "time left not known yet (no last run to go by)"
        return f"about {_minutes((self.clock() - self.started) * len(left) / done)} left (rough: no last run to go by)"

    def line(self) -> str:
        with self.lock:
            done, failed = len(self.finished), len(self.failed)
        total = f" of {len(self.ids)}" if self.ids else ""
        return (f"{done}{total} tests done, {failed} failed, {_minutes(self.clock() - self.started)} so far, "
                f"{self.time_left()}")

    def say(self, message: str) -> None:
        self.last_line = self.clock()
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        writer = getattr(reporter, "_tw", None)
        width = getattr(writer, "width_of_current_line", 0)
        newline = "\n" if width and width != self.written_at else ""  # on a line of its own, after the dots
        saved = self._terminal_fd()
        if saved is not None:  # the heartbeat, while a test runs in this process: pytest captures fd 1 then
            os.write(saved, f"{newline}[course] {message}\n".encode())
            self.written_at = width  # pytest does not know the line was ended
        elif writer is not None:
            if width:
                writer.line()
            reporter.write_line(f"[course] {message}")
            writer.flush()
        else:
            print(f"[course] {message}", flush=True)

    def _terminal_fd(self) -> int | None:
        """The terminal's own file descriptor where pytest is capturing this process's output now, else None."""
        if threading.current_thread() is threading.main_thread():
            return None
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        if capture is None or not capture.is_globally_capturing():
            return None
        saved = getattr(getattr(getattr(capture, "_global_capturing", None), "out", None), "targetfd_save", None)
        return saved if isinstance(saved, int) else None

    def _heartbeat(self) -> None:
        while not self.stop.wait(min(1.0, self.interval / 4)):
            if self.clock() - self.last_line >= self.interval and len(self.finished) < len(self.ids):
                self.say(self.line())


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller speaks
        return
    interval = float(os.environ.get("COURSE_PROGRESS_INTERVAL", INTERVAL))
    history = Path(os.environ.get("COURSE_PROGRESS_HISTORY", HISTORY))
    config.pluginmanager.register(SuiteProgress(config, history, interval), "course-suite-progress")
