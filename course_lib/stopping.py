"""How the course's commands stop: SIGTERM as Ctrl-C does, and children that die with the process that started them.

Every process of the course that starts children of its own (`check`, pytest, the grader, the self-checks) calls
`stop_like_ctrl_c()`: SIGTERM (and SIGHUP) then raise KeyboardInterrupt, so that the same `finally` blocks that
Ctrl-C runs stop the children (ranks, judges, workers); SIGTERM's default, ending the process at once, would leave
every child started in a session of its own running. A child that must not outlive its parent even when the parent
is SIGKILLed gets `dies_with_me()` in its environment and calls `die_with_parent_if_asked()` first thing (the course's
pytest plugin does).
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

PARENT_VARIABLE = "COURSE_DIE_WITH_PARENT"  # the pid of the process a child must die with
STOPPING_SIGNALS = ("SIGTERM", "SIGHUP")  # raised as KeyboardInterrupt, like SIGINT


def interrupt(signum, frame):
    """A signal handler: raise KeyboardInterrupt, as Ctrl-C does."""
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


_first_stop: list[float] = []


def interrupt_once(signum, frame):
    """A signal handler: KeyboardInterrupt at the first stop signal; more in the next second are the same stop
    arriving twice (sent to the whole process group, and passed on by the parent: `interrupt_children`)."""
    now = time.monotonic()
    if _first_stop and now - _first_stop[0] < 1.0:
        return
    _first_stop[:] = [now]
    interrupt(signum, frame)


def interrupt_children(signum, frame):
    """A signal handler: pass the signal on to the processes below this one in its own process group, as a
    terminal's Ctrl-C reaches them all (pytest-xdist's workers and their fork servers, which a signal sent to their
    controller alone, `kill PID`, would leave running their tests), then raise KeyboardInterrupt."""
    me, group = os.getpid(), os.getpgrp()
    children: dict[int, list[tuple[int, int]]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:  # not Linux
        entries = []
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    fields = handle.read().rsplit(b")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append((int(entry), int(fields[2])))
            except (OSError, IndexError, ValueError):
                continue
    todo = [me]
    while todo:
        for pid, pgrp in children.get(todo.pop(), []):
            todo.append(pid)
            if pgrp == group:
                try:
                    os.kill(pid, signum)
                except OSError:
                    pass
    interrupt(signum, frame)


def stop_like_ctrl_c(handler=interrupt, sigint: bool = False) -> dict:
    """SIGTERM and SIGHUP raise KeyboardInterrupt in this process, as Ctrl-C does (or call `handler`, with `sigint`
    for SIGINT too); Ctrl-C works even where the process was started with SIGINT ignored (in the background by a
    shell script). Only in the main thread (where Python runs signal handlers) and only for signals that nobody else
    handles; returns the previous handlers, for `restore`."""
    previous: dict = {}
    if threading.current_thread() is not threading.main_thread():
        return previous
    for name in STOPPING_SIGNALS:
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) in (signal.SIG_DFL, None):
            previous[number] = signal.signal(number, handler)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN or (
            sigint and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, handler if sigint else signal.default_int_handler)
    return previous


def restore(previous: dict) -> None:
    """Put back the handlers `stop_like_ctrl_c` replaced."""
    if threading.current_thread() is threading.main_thread():
        for number, handler in previous.items():
            signal.signal(number, handler)


def dies_with_me() -> dict[str, str]:
    """Environment variables that ask a child started from this thread to die when this thread does (the parent
    death signal of Linux is tied to the thread that started the child)."""
    return {PARENT_VARIABLE: str(os.getpid())}


def die_with_parent_if_asked() -> None:
    """If the environment asks (dies_with_me), have Linux SIGKILL this process when its parent dies.

    The variable is removed, so that nothing this process starts inherits it. Nothing happens where the parent is
    not the process that asked: the variable reached a grandchild, or the parent died already (its `finally` or its
    own parent stops what it started)."""
    parent = os.environ.pop(PARENT_VARIABLE, None)
    if not parent or not parent.isdigit():
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux
        return
    if os.getppid() != int(parent):
        libc.prctl(1, 0)  # not the parent that asked: leave it
