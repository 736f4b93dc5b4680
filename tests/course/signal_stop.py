"""Stop a command of the course with a signal mid-run, and list what it left running.

    with Stopping([sys.executable, "course.py", "check", "ex00"], tmp_path / "log") as run:
        run.wait_until(lambda tree: any(is_rank(p, tree) for p in tree), "a rank runs")
        stopped = run.stop(signal.SIGINT)
    assert stopped.seconds <= STOP_WITHIN and not stopped.left, stopped.report()

The command starts in a session of its own with an environment variable of its own (MARKER, a fresh token), as a
user's shell would start it. What it runs is followed two ways, both read from Linux's /proc: by parent links from the
command (a judge, a kernel or a browser that starts a session of its own is still below it), and by the marker in
each process's environment (a process whose parent died is no longer below anything, but keeps its environment;
the grader's judges start with an environment of their own and are found by parent links). Every process seen
while waiting is remembered with its start time, so that one left behind after its parent died is still listed, and
a pid the kernel gave to a new process meanwhile is not. `stop` signals the command's process only (like
`kill -INT PID`, the case where nothing else receives the signal), then waits until the command has exited and
everything remembered is gone (but what its `spare` names: a learner's web browser), or STOP_WITHIN seconds. On exit,
whatever is left is SIGKILLed.

Nothing here imports pytest.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

MARKER = "COURSE_STOPPING_TEST"
STOP_WITHIN = 10.0  # seconds from the signal until the command has exited and left nothing running: the requirement


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start: int  # clock ticks after boot (/proc/PID/stat field 22): with the pid, names one process for good
    cmdline: str

    @property
    def key(self) -> tuple[int, int]:
        return self.pid, self.start


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _carries(pid: int, needle: bytes) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def live(proc: Proc) -> bool:
    """The process is still there (not exited, not a zombie) and is the same one (its start time)."""
    found = _stat(proc.pid)
    return found is not None and found[0] != "Z" and found[2] == proc.start


def processes() -> dict[int, Proc]:
    """Every live process of the machine."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] != "Z":
                found[int(entry)] = Proc(int(entry), stat[1], stat[2], "")
    return found


def is_forkserver(proc: Proc) -> bool:
    return "multiprocessing.forkserver import main" in proc.cmdline


def is_rank(proc: Proc, tree: list[Proc]) -> bool:
    """A rank: forked from a fork server, so it has the fork server's command line, as does its parent."""
    parents = {p.pid: p for p in tree}
    return is_forkserver(proc) and proc.ppid in parents and is_forkserver(parents[proc.ppid])


def below(tree: list[Proc], top: Callable[[Proc], bool]) -> list[Proc]:
    """The processes of `tree` below one for which `top` holds."""
    children: dict[int, list[Proc]] = {}
    for proc in tree:
        children.setdefault(proc.ppid, []).append(proc)
    found, todo = [], [p.pid for p in tree if top(p)]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found


@dataclass
class Stopped:
    signal: str
    seconds: float  # from the signal until the command exited (inf: it had not, STOP_WITHIN later)
    returncode: int | None
    left: list[Proc] = field(default_factory=list)  # still running STOP_WITHIN s after the signal
    log: str = ""
    all_gone: float = float("inf")  # from the signal until nothing it ran was left (inf: not STOP_WITHIN later)

    def report(self) -> str:
        lines = [f"after {self.signal}: the command " + (f"exited with {self.returncode} after {self.seconds:.1f} s"
                                                          if self.returncode is not None else
                                                          f"was still running {STOP_WITHIN:g} s later")
                 + (f"; all it ran was gone after {self.all_gone:.1f} s" if self.all_gone < float("inf") else "")]
        if self.left:
            lines.append(f"{len(self.left)} processes still running {STOP_WITHIN:g} s after the signal:")
            lines += [f"  {p.pid} (parent {p.ppid}): {p.cmdline[:300]}" for p in self.left]
        return "\n".join(lines) + f"\nits output ends:\n{self.log[-4000:]}"


class Stopping:
    """A command in a session of its own, marked, with everything it ran (see the module's docstring)."""

    def __init__(self, command: list[str], log: Path, *, cwd: str | os.PathLike | None = None,
                 env: dict[str, str] | None = None):
        self.token = secrets.token_hex(8)
        self.log = log
        self.seen: dict[tuple[int, int], Proc] = {}
        with open(log, "wb") as out:
            self.process = subprocess.Popen(command, cwd=cwd, env={**(env or os.environ), MARKER: self.token},
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        self.top = _stat(self.process.pid)

    def __enter__(self) -> Stopping:
        return self

    def __exit__(self, *exc) -> None:
        self.kill_all()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def tree(self) -> list[Proc]:
        """Every live process now below the command or carrying its marker; each is remembered in `seen`."""
        everything = processes()
        children: dict[int, list[int]] = {}
        for proc in everything.values():
            children.setdefault(proc.ppid, []).append(proc.pid)
        pids, todo = set(), [self.process.pid] if self.process.pid in everything else []
        while todo:
            pid = todo.pop()
            pids.add(pid)
            todo += children.get(pid, [])
        needle = f"{MARKER}={self.token}".encode()
        pids |= {pid for pid in everything if pid not in pids and _carries(pid, needle)}
        found = []
        for pid in pids:
            proc = Proc(pid, everything[pid].ppid, everything[pid].start, _cmdline(pid))
            if live(proc):
                found.append(proc)
                self.seen.setdefault(proc.key, proc)
        return found

    def wait_until(self, ready: Callable[[list[Proc]], bool], what: str, timeout: float = 180) -> list[Proc]:
        """Poll the tree until `ready(tree)`; fail (AssertionError) if the command ends first or `timeout` passes.

        The timeout is generous: how long a command takes to get going (Python, torch, a fork server, a sandbox)
        depends on how loaded the machine is; only the seconds after the signal are the requirement."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            tree = self.tree()
            if ready(tree):
                return tree
            if self.process.poll() is not None:
                raise AssertionError(f"the command ended (exit code {self.process.returncode}) before {what}; its "
                                     f"output ends:\n{self.output()[-4000:]}")
            time.sleep(0.2)
        raise AssertionError(f"not within {timeout:g} s: {what}; running:\n"
                             + "\n".join(f"  {p.pid} {p.cmdline[:200]}" for p in self.tree())
                             + f"\nits output ends:\n{self.output()[-4000:]}")

    def stop(self, sig: int, within: float = STOP_WITHIN,
             spare: Callable[[Proc], bool] = lambda proc: False) -> Stopped:
        """Send `sig` to the command's process alone; wait until it exited and everything it ran is gone (but what
        `spare` names, which may stay)."""
        self.tree()  # the last look before the signal
        started = time.monotonic()
        self.process.send_signal(sig)
        exited = gone = float("inf")
        while time.monotonic() - started < within:
            if exited == float("inf") and self.process.poll() is not None:
                exited = time.monotonic() - started
            self.tree()  # what the stopping starts is remembered too
            if exited != float("inf") and not self.left(spare):
                gone = time.monotonic() - started
                break
            time.sleep(0.1)
        if exited == float("inf") and self.process.poll() is not None:
            exited = time.monotonic() - started
        return Stopped(signal.Signals(sig).name, exited, self.process.returncode, self.left(spare), self.output(),
                       gone)

    def left(self, spare: Callable[[Proc], bool] = lambda proc: False) -> list[Proc]:
        return sorted((p for p in self.seen.values() if live(p) and p.pid != self.process.pid and not spare(p)),
                      key=lambda p: p.pid)

    def kill_all(self) -> None:
        """SIGKILL the command and everything it left (the test's own clean-up, whatever the test found)."""
        self.tree()
        for proc in [*self.left()]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
