"""The grader's memory watchdog: pages that forked processes share count once, and a hog is still stopped.

The processes are simulated (the watchdog's three views of /proc are replaced), so the tests wait for what the
watchdog has done, with deadlines far above what it needs, rather than for fixed times."""

from __future__ import annotations

import time

from course_lib.grading import memory_guard

MB = 2**20
CLOSE_LOOK = 0.02  # seconds per process for the proportional count (about 0.09 s for a process with torch loaded)


def _until(condition, deadline):
    stop = time.monotonic() + deadline
    while not condition() and time.monotonic() < stop:
        time.sleep(0.01)
    return condition()


class Processes:
    """What the watchdog sees: (pid, cheap bytes, proportional bytes) per process; a kill removes one."""

    def __init__(self, monkeypatch, processes):
        self.processes, self.close_looks, self.killed = list(processes), 0, []
        monkeypatch.setattr(memory_guard, "descendants", lambda top: [pid for pid, _, _ in self.processes])
        monkeypatch.setattr(memory_guard, "_anon_bytes", lambda pid: self._get(pid, 1))
        monkeypatch.setattr(memory_guard, "_proportional_bytes", self._proportional)
        monkeypatch.setattr(memory_guard.os, "kill", self._kill)

    def _get(self, pid, field):
        return next((entry[field] for entry in self.processes if entry[0] == pid), 0)

    def _proportional(self, pid):
        time.sleep(CLOSE_LOOK)
        self.close_looks += 1
        return self._get(pid, 2)

    def _kill(self, pid, signal):
        self.killed.append(pid)
        self.processes = [entry for entry in self.processes if entry[0] != pid]


def _family():  # 21 processes of 300 MB resident each, all the same copy-on-write pages: 6.3 GB by the cheap count
    return [(100 + i, 300 * MB, 20 * MB) for i in range(21)]


def _watchdog(limit=1000 * MB):
    watchdog = memory_guard.RssWatchdog(top=0, limit_bytes=limit, interval=0.005)
    watchdog.start()
    return watchdog


def test_forked_children_that_share_their_parents_pages_are_not_killed(monkeypatch):
    seen = Processes(monkeypatch, _family())
    watchdog = _watchdog()
    try:
        assert _until(lambda: seen.close_looks >= 21, 10), "the watchdog never looked closer"
        time.sleep(0.2)
    finally:
        watchdog.stop()
        watchdog.join(5)
    assert seen.killed == []


def test_a_hog_is_killed_soon_after_the_shared_processes_are_gone(monkeypatch):
    seen = Processes(monkeypatch, _family())
    watchdog = _watchdog()
    try:
        assert _until(lambda: seen.close_looks >= 21, 10), "the watchdog never looked closer"
        seen.processes = [(500, 1500 * MB, 1500 * MB)]  # a new process with its own memory, over the limit
        # A close look at the family took 21 × CLOSE_LOOK = 0.42 s: the hog must not wait out a back-off of it.
        assert _until(lambda: seen.killed, 2.0), "the hog was not stopped within 2 s"
    finally:
        watchdog.stop()
        watchdog.join(5)
    assert seen.killed == [500]


def test_a_process_that_grows_after_a_close_look_is_killed(monkeypatch):
    seen = Processes(monkeypatch, _family())
    watchdog = _watchdog()
    try:
        assert _until(lambda: seen.close_looks >= 21, 10), "the watchdog never looked closer"
        seen.processes[0] = (100, 1500 * MB, 1220 * MB)  # pid 100 wrote 1.2 GB of private pages
        assert _until(lambda: seen.killed, 2.0), "the grown process was not stopped within 2 s"
    finally:
        watchdog.stop()
        watchdog.join(5)
    assert seen.killed == [100]
