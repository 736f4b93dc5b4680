"""The judge's side of a student's memory limit: who stopped the ranks, and what the student reads (the grader's).

The grader bounds all of one student's processes together, on every machine (an address-space limit
per process cannot be used where CUDA runs: CUDA reserves far more address space than it uses):

* a memory cgroup, made by the grader, where the kernel's out-of-memory killer stops a rank at the
  limit; the judge counts its kills (`memory.oom_control` on cgroup v1, `memory.events` on v2);
* elsewhere (not root, no delegated cgroup) a watchdog thread in the judge, which polls the memory of every
  process below the judge (pages shared copy-on-write counted once, not once per process) and kills the
  largest while the total is over the limit.

Either way, a rank that dies by SIGKILL while the kill count went up fails its test with
`memory_message()`, not with a bare "killed by signal 9".
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from course_lib.dist.forkserver import descendants

__all__ = ["MemoryGuard", "RssWatchdog", "memory_message"]

GiB = 2**30
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def memory_message(limit_bytes: int, how: str) -> str:
    """What a student reads when their processes were stopped for using too much memory."""
    return (f"MemoryError: your code used more than {limit_bytes / GiB:g} GiB of memory (the limit for all of a "
            f"student's processes together) and was stopped ({how}). Use smaller tensors, or free what you no "
            "longer need.")


def cgroup_oom_kills(folder: str | os.PathLike, version: int) -> int:
    """How many processes the kernel has killed at this memory cgroup's limit so far."""
    name = "memory.oom_control" if version == 1 else "memory.events"
    try:
        for line in (Path(folder) / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _anon_bytes(pid: int) -> int:
    """Resident memory that no file backs (statm: resident - shared), in bytes.

    Cheap (0.05 ms), but a page that processes share copy-on-write (every rank shares torch's heap with the
    fork server it was forked from) counts once per process: an over-count of a few hundred MB per process.
    So it only decides whether to look closer (`_proportional_bytes`), never whom to kill.
    """
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            fields = handle.read().split()
        return (int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _proportional_bytes(pid: int) -> int:
    """The process's share of anonymous and shared memory (smaps_rollup's Pss_Anon + Pss_Shmem), in bytes.

    A page shared by n processes counts 1/n in each, so the total over a student's processes is the memory
    they really hold. Slow (about 90 ms for a process with torch loaded). Older kernels without Pss_Anon:
    the whole Pss, file-backed pages included (an over-count, on the safe side)."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            for line in handle:
                key, _, rest = line.decode().partition(":")
                if key in ("Pss", "Pss_Anon", "Pss_Shmem"):
                    fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return _anon_bytes(pid)
    if "Pss_Anon" in fields:
        return fields["Pss_Anon"] + fields.get("Pss_Shmem", 0)
    return fields.get("Pss", 0)


class RssWatchdog(threading.Thread):
    """Polls every process below `top` and SIGKILLs the largest while their total is over `limit_bytes`.

    Each poll sums the cheap resident count, less the over-count that the last close look found in each
    process still alive; only when that estimate is over the limit are the processes measured by their
    proportional share (`_proportional_bytes`), which decides whom to kill. Memory a process allocates after
    a close look is private, so it raises the estimate as fast as it grows: a hog is still caught within a
    poll or two, while close looks stay under about a tenth of a core.
    """

    def __init__(self, top: int, limit_bytes: int, interval: float = 0.1):
        super().__init__(name="memory-watchdog", daemon=True)
        self.top, self.limit, self.interval = top, limit_bytes, interval
        self.kills: list[tuple[float, int, int]] = []  # (time, pid, bytes)
        self.peak = 0
        self._stopped = threading.Event()

    def run(self) -> None:
        shared: dict[int, int] = {}  # per process, how much the last close look found the cheap count over
        next_close_look = 0.0
        while not self._stopped.wait(self.interval):
            cheap = {pid: _anon_bytes(pid) for pid in descendants(self.top)}
            # Growth since a process's last close look is private memory: it shows in both counts.
            estimate = sum(value - shared.get(pid, 0) for pid, value in cheap.items())
            if estimate <= self.limit or (time.monotonic() < next_close_look and estimate <= 1.1 * self.limit):
                self.peak = max(self.peak, estimate)
                continue
            started = time.monotonic()
            usage = {pid: _proportional_bytes(pid) for pid in cheap}
            shared = {pid: max(0, cheap[pid] - usage[pid]) for pid in cheap}
            total = sum(usage.values())
            self.peak = max(self.peak, total)
            # Close looks take at most a tenth of a core, unless the estimate runs 10% past the limit.
            next_close_look = time.monotonic() + 9 * (time.monotonic() - started)
            while usage and total > self.limit:
                pid = max(usage, key=usage.get)
                self.kills.append((time.monotonic(), pid, usage[pid]))  # before the kill: the judge may look at once
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                total -= usage.pop(pid)

    def stop(self) -> None:
        self._stopped.set()


class MemoryGuard:
    """The judge's view of one student's memory limit (from the Confinement): counts the kills, words the failure."""

    def __init__(self, limit_bytes: int, cgroup: str | None = None, cgroup_version: int = 1, watchdog: bool = False):
        self.limit, self.cgroup, self.cgroup_version = limit_bytes, cgroup, cgroup_version
        self.watchdog = RssWatchdog(os.getpid(), limit_bytes) if watchdog and not cgroup else None

    @classmethod
    def for_confinement(cls, confinement) -> "MemoryGuard | None":
        if not confinement.memory_limit_bytes or not (confinement.memory_cgroup or confinement.memory_watchdog):
            return None
        return cls(confinement.memory_limit_bytes, confinement.memory_cgroup, confinement.memory_cgroup_version,
                   confinement.memory_watchdog)

    def start(self) -> None:
        if self.watchdog is not None and not self.watchdog.is_alive():
            self.watchdog.start()

    def stop(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()

    def kills(self) -> int:
        if self.cgroup:
            return cgroup_oom_kills(self.cgroup, self.cgroup_version)
        return len(self.watchdog.kills) if self.watchdog is not None else 0

    def message(self) -> str:
        how = ("the kernel's out-of-memory killer, at the memory cgroup's limit" if self.cgroup
               else "the grader's memory watchdog")
        return memory_message(self.limit, how)
