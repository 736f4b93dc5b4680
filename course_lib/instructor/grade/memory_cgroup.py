"""A memory (and pids) cgroup per student: the kernel bounds all of a student's processes together.

Made under the grader's OWN cgroup (never at the root of a hierarchy), so the students stay inside
whatever accounting the machine already applies to the grader. The judge reads the kills it causes
(course_lib.grading.memory_guard); the grader reads its peak and removes it, with anything left in it.
Checked on cgroup v1 (memory and pids controllers, as root). The cgroup v2 code follows the kernel's
documentation but has not been run: no machine with a v2 memory controller was at hand.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CGROUPS = Path("/sys/fs/cgroup")


@dataclass
class CgroupInfo:
    """Where this process may make child cgroups, or why it may not."""

    version: int  # 1 or 2
    memory: Path | None  # the folder under which memory cgroups can be made (this process's own cgroup)
    pids: Path | None  # the same for the pids controller (cgroup v1: a hierarchy of its own)
    problem: str = ""


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path for `controller` (v1), or the unified one (controller '')."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if (controller == "" and names == "") or (controller and controller in names.split(",")):
            return path
    return None


def _can_make_child(folder: Path) -> bool:
    probe = folder / f"course-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return False
    return True


def detect_cgroup() -> CgroupInfo | None:
    """Where this process can make a memory cgroup for a student, on cgroup v1 or v2; None without cgroups."""
    v1 = CGROUPS / "memory"
    if (v1 / "memory.limit_in_bytes").exists():
        own = _own_cgroup("memory")
        pids_own = _own_cgroup("pids")
        info = CgroupInfo(1, v1 / own.lstrip("/") if own is not None else None,
                          CGROUPS / "pids" / pids_own.lstrip("/") if pids_own and (CGROUPS / "pids").is_dir() else None)
    elif (CGROUPS / "cgroup.controllers").exists():
        own = _own_cgroup("")
        folder = CGROUPS / own.lstrip("/") if own is not None else None
        delegated = folder is not None and "memory" in _words(folder / "cgroup.subtree_control")
        info = CgroupInfo(2, folder if delegated else None, folder if delegated else None)
        if not delegated:
            # v2 enables a controller for the children only of a cgroup that holds no process itself,
            # and the grader is such a process: start it in a delegated scope.
            info.problem = ("cgroup v2 without the memory controller delegated to the grader's children (start "
                            "the grader with `systemd-run --scope -p Delegate=yes ...` to get one)")
    else:
        return None
    for attr in ("memory", "pids"):
        folder = getattr(info, attr)
        if folder is not None and not _can_make_child(folder):
            setattr(info, attr, None)
            info.problem = info.problem or f"no permission to make a cgroup under {folder}"
    return info


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


class StudentCgroup:
    """One student's memory cgroup (and pids cgroup): made with its limits, removed with whatever is left in it."""

    def __init__(self, info: CgroupInfo, name: str, limit_bytes: int, max_pids: int = 0):
        self.version, self.limit = info.version, limit_bytes
        self.memory = info.memory / name
        self.pids = info.pids / name if info.pids is not None and max_pids and info.version == 1 else None
        self.memory.mkdir(exist_ok=True)
        if info.version == 1:
            (self.memory / "memory.limit_in_bytes").write_text(str(limit_bytes))
            _try_write(self.memory / "memory.memsw.limit_in_bytes", str(limit_bytes))  # no swapping past it
            if self.pids is not None:
                self.pids.mkdir(exist_ok=True)
                (self.pids / "pids.max").write_text(str(max_pids))
        else:
            (self.memory / "memory.max").write_text(str(limit_bytes))
            _try_write(self.memory / "memory.swap.max", "0")
            if max_pids:
                _try_write(self.memory / "pids.max", str(max_pids))

    def procs_files(self) -> list[Path]:
        """The files a process writes its pid to, to move itself (and its future children) in."""
        return [self.memory / "cgroup.procs"] + ([self.pids / "cgroup.procs"] if self.pids is not None else [])

    def peak_bytes(self) -> int:
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            return int((self.memory / name).read_text())
        except (OSError, ValueError):
            return 0

    def remove(self) -> None:
        """Kill every process still in it, then remove it (a moment after the last one died)."""
        for folder in [self.memory] + ([self.pids] if self.pids is not None else []):
            for _ in range(100):
                try:
                    pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
                except OSError:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # busy until its last process has gone
                    time.sleep(0.05)


def _try_write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError:  # the file exists only with swap accounting, or the controller is missing
        pass
