"""The fork server that ranks are forked from: torch imported once, a launch in a tenth of a second (notebook 04).

`start_fork_server()` starts it with this Python, as every learner's `launch` does. The grader's judge
starts it through another executable instead (`start_fork_server(executable)`, a script that runs
this Python in a sandbox with a pid namespace of its own), so every rank is forked inside that
sandbox. The fork server then reports the ranks' pids as the sandbox sees them, which mean other
processes out here: such ranks are never signalled by pid, only by `kill_sandbox_processes()`.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.spawn as mp_spawn
import os
import signal
import threading
from pathlib import Path

__all__ = ["start_fork_server", "context", "sandboxed", "kill_sandbox_processes", "ranks_do_not_import_main",
           "descendants", "preload"]

_context: mp.context.BaseContext | None = None
_executable: str | None = None  # what the running fork server was started with; None: this Python
_start_lock = threading.Lock()
_preload = ["course_lib.dist.rank"]  # imported by the fork server before it forks anything


def preload(module: str) -> None:
    """Have the next fork server import `module` too, so that no rank pays for importing it (the graders' runner)."""
    if module not in _preload:
        _preload.append(module)


def context() -> mp.context.BaseContext:
    """The forkserver context the ranks are made with (start_fork_server() first)."""
    return _context


def start_fork_server(executable: str | None = None) -> None:
    """Start the fork server that ranks are forked from, with torch already imported (notebook 04).

    The first launch calls this itself and pays about two seconds; calling it early hides that.
    `executable` (the grader's sandbox) runs the fork server and multiprocessing's resource tracker
    instead of this Python; a server started with another executable is stopped and started again.
    """
    global _context, _executable
    if _context is None:
        _context = mp.get_context("forkserver")
    # Last, once every preload is in: the record of torch's and the course's functions that kept ranks put back
    # between tests (course_lib.dist.fresh_state records it when imported; each rank forked after shares it).
    _context.set_forkserver_preload([*_preload, "course_lib.dist.fresh_state"])
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if executable != _executable and server._forkserver_pid is not None:
        server._stop()  # started for another sandbox (or none): never mix the two
    with ranks_do_not_import_main(sandboxed=executable is not None):
        if executable is None:
            forkserver.ensure_running()
        else:
            previous = mp_spawn.get_executable()
            mp_spawn.set_executable(executable)  # the resource tracker, started first, is sandboxed too
            try:
                forkserver.ensure_running()
            finally:
                mp_spawn.set_executable(previous)
    _executable = executable


def sandboxed() -> bool:
    """Whether the running fork server was started through an executable of the grader's (a sandbox)."""
    return _executable is not None


@contextlib.contextmanager
def ranks_do_not_import_main(sandboxed: bool = False):
    """Stop multiprocessing from re-running the parent's __main__ in each rank.

    The function travels by value with cloudpickle, so the ranks never need the parent's
    script; re-running it would re-run an unguarded script's launch() in every rank (the
    classic missing `if __name__ == "__main__"`), and costs time. In a sandbox the parent's
    working folder does not exist either: the rank then stays where the sandbox put it.
    """
    original = mp_spawn.get_preparation_data

    def without_main(name):
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        if sandboxed:
            data.pop("dir", None)
        return data

    with _start_lock:
        mp_spawn.get_preparation_data = without_main
        try:
            yield
        finally:
            mp_spawn.get_preparation_data = original


def kill_sandbox_processes() -> None:
    """SIGKILL every process in the fork server's sandbox except the sandbox's init and the fork server.

    Called after each launch from a sandboxed server: the ranks, and whatever they started and left
    behind (a grandchild that called setsid and ignores signals), go; the next launch finds only the
    server. With a pid namespace, the sandbox's init is pid 1 in it and the fork server pid 2; with
    none (a wrapper that only runs Python, e.g. in a memory cgroup), the server is the wrapper itself.
    """
    from multiprocessing import forkserver

    top = forkserver._forkserver._forkserver_pid
    if top is None:
        return
    for pid in descendants(top):
        inner = _namespace_pid(pid)
        if inner in (1, 2):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _namespace_pid(pid: int) -> int | None:
    """`pid`'s number in the pid namespace just below ours (None when it has none, or is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                numbers = line.split()[1:]
                return int(numbers[1]) if len(numbers) >= 2 else None
    except (OSError, ValueError):
        pass
    return None


def descendants(top: int) -> list[int]:
    """Pids of every process below `top`, found in one pass over /proc (reading each one's status is slower)."""
    children: dict[int, list[int]] = {}
    if not os.path.isdir("/proc"):  # not Linux: no sandbox, nothing to find
        return []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue
            parent = int(stat[stat.rindex(b")") + 2:].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [top]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
