"""Running a command of the course so that Ctrl-C, SIGTERM or SIGHUP stops everything it started (the README's
set-up, before notebook 00): `run_child` runs it in a session of its own, passes the signal on, and SIGKILLs what is
left after a grace period, even what escaped into sessions of its own. Standard library only: course.py runs it.

(course_lib/stopping.py is the other side: how the course's own Python processes, once started, turn SIGTERM into
Ctrl-C and die with their parent.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from course_lib.setup import say
from course_lib.tables import plural

STOP_GRACE = 6.0  # seconds a stopped command has to stop what it started; then whatever is left is SIGKILLed
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


class Stopped(KeyboardInterrupt):
    """The command was stopped by a signal (Ctrl-C, SIGTERM, SIGHUP); course.py exits with 128 + its number."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def run_child(command: list[str], cwd: Path | None = None, interrupt: int = signal.SIGINT,
              outside_group=lambda pid: True) -> int:
    """Run `command` and return its exit code; if this process is stopped, stop it and everything it started.

    The command runs in a session of its own, so that it and what it starts can be signalled as one process group
    (a terminal's Ctrl-C reaches it from here, once). Ctrl-C, SIGTERM or SIGHUP here is passed on to that group
    (Ctrl-C as `interrupt`); STOP_GRACE seconds later, whatever is still running is SIGKILLed: the group, and every
    process below this one for which `outside_group(pid)` holds, even in a session of its own (a kernel, a judge, a
    browser of the tests) or orphaned meanwhile (this process adopts them, as a Linux "subreaper"). Then Stopped is
    raised.
    """
    received: list[tuple[int, float]] = []  # (signal, when)
    process: subprocess.Popen | None = None
    below_at_signal: dict[int, int] = {}  # pid -> start time of every process below this one at the first signal

    def pass_on(signum: int) -> None:
        if process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, interrupt if signum == signal.SIGINT else signum)

    def on_signal(signum, frame) -> None:
        if not received:
            _adopt_orphans()
            below_at_signal.update(_below(os.getpid(), _processes()))
        received.append((signum, time.monotonic()))
        pass_on(signum)

    handled = [getattr(signal, name) for name in STOP_SIGNALS if hasattr(signal, name)]
    previous = {number: signal.signal(number, on_signal) for number in handled}
    try:
        process = subprocess.Popen(command, cwd=cwd, start_new_session=True)
        if received:  # a signal came while the command was being started
            pass_on(received[0][0])
        while process.poll() is None and not received:
            time.sleep(0.2)  # polled: a signal handler cannot end a blocking wait
        if not received:
            return process.returncode
        signum, when = received[0]
        _stop_everything(process, below_at_signal, when + STOP_GRACE, signum, outside_group)
        raise Stopped(signum)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if process is not None and process.poll() is None:  # an error here: never leave the command behind
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _stop_everything(process: subprocess.Popen, below_at_signal: dict[int, int], deadline: float, signum: int,
                     outside_group) -> None:
    """Wait until the stopped command and everything below this process (that `outside_group` takes) are gone, up to
    `deadline`; then SIGKILL what is left, and reap what this process adopted."""
    def left() -> set[int]:
        everything = _processes()
        known = {pid for pid, start in below_at_signal.items() if everything.get(pid, (0, None))[1] == start}
        return {pid for pid in (set(_below(os.getpid(), everything)) | known) - {os.getpid()}
                if pid == process.pid or outside_group(pid)}

    while time.monotonic() < deadline and (process.poll() is None or left()):
        time.sleep(0.05)
    killed = set()
    for _ in range(20):  # a killed parent's children come to this process: again until none is left
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        pids = left()
        if not pids and process.poll() is not None:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        time.sleep(0.05)
    process.wait()
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    if killed:
        were = "was" if len(killed) == 1 else "were"
        say(f"{plural(len(killed), 'process', 'processes')} {were} still running {STOP_GRACE:g} s after "
            f"{signal.Signals(signum).name}: killed")


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent's pid, start time) of every live process, from Linux's /proc ({} without one)."""
    found = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    fields = handle.read().rsplit(b")", 1)[1].split()
                if fields[0] != b"Z":  # a zombie has ended already
                    found[int(entry)] = (int(fields[1]), int(fields[19]))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _below(top: int, everything: dict[int, tuple[int, int]]) -> dict[int, int]:
    """pid -> start time of every process below `top`."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in everything.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, [top]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = everything[child][1]
            todo.append(child)
    return found


def _adopt_orphans() -> None:
    """Linux: processes below this one whose parent dies come to this one (not to init), so they are still found."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass
