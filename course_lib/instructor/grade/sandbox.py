"""What protects the grader on this machine: the sandbox, users per student, memory bounds; said aloud.

`detect_isolation()` finds out once, at the start of a grading run, and `Isolation.describe()` prints the
protections, with a WARNING line for every one this machine cannot give and what that leaves open.

| protection | needs | without it |
|---|---|---|
| allow-list of files, no network, own pids (bwrap.py) | bubblewrap, as root or with user namespaces | a mount namespace hiding the known secrets (mount_namespace.py), a deny-list |
| a user of its own per student (users.py) | root | student code runs as the grader's user |
| all of a student's memory bounded (memory_cgroup.py) | a writable memory cgroup (root) | a watchdog on resident memory in the judge |
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from course_lib.instructor.grade.bwrap import SandboxSpec, bwrap_argv
from course_lib.instructor.grade.memory_cgroup import CgroupInfo, detect_cgroup
from course_lib.instructor.grade.mount_namespace import python_unreachable_by_others, unshare_prefix

MODES = ("bwrap", "unshare", "none")


@dataclass
class Isolation:
    """The isolation this machine allows and the grader uses, and what is missing (said once, at the start)."""

    root: bool
    mode: str  # bwrap (an allow-list), unshare (the fallback: a deny-list) or none
    bwrap: str | None = None  # the bwrap executable, in mode bwrap
    hide_command: list[str] | None = None  # the unshare prefix, in mode unshare
    users: bool = False  # each student's code runs as a user of its own (needs root)
    memory: str = "watchdog"  # how all of a student's memory is bounded: cgroup or watchdog
    cgroup: CgroupInfo | None = None
    problems: list[str] = field(default_factory=list)

    def describe(self) -> str:
        have = ["a judge process apart from student code"]
        if self.mode == "bwrap":
            have.append("student code sees only an allow-list of the filesystem (bubblewrap: Python, its packages, "
                        "the course library and its own scratch folder), no network but loopback, and none of the "
                        "grader's processes")
        elif self.mode == "unshare":
            have.append("the solutions, submissions, hidden tests and the gradebook hidden by a mount namespace")
        if self.users:
            have.append("a user of its own for each student's code")
        have.append("the memory of all of a student's processes bounded by " +
                    ("a memory cgroup" if self.memory == "cgroup" else "a watchdog on resident memory"))
        have.append("time limits per test and per student")
        return "protections: " + "; ".join(have) + "".join(f"\nWARNING: {line}" for line in self.problems)


def probe_bwrap(bwrap: str, root: bool) -> tuple[bool, str]:
    """Can this user make the sandbox the grader needs (new mount, pid and network namespaces, loopback up)?"""
    argv = bwrap_argv(SandboxSpec(read_only=[], writable=[], python=False), root=root, bwrap=bwrap)
    argv += ["/bin/sh", "-c", "test -e /proc/1 && test ! -e /home && grep -q ' lo' /proc/net/dev"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, str(error)
    return done.returncode == 0, (done.stderr or done.stdout).strip()[-300:]


def _choose_mode(requested: str, root: bool, problems: list[str]) -> tuple[str, str | None, list[str] | None]:
    bwrap = shutil.which("bwrap") if sys.platform.startswith("linux") else None
    if bwrap and requested in ("auto", "bwrap"):
        ok, why = probe_bwrap(bwrap, root)
        if ok:
            return "bwrap", bwrap, None
        problems.append(f"bubblewrap is installed but cannot make a sandbox as this user ({why or 'it failed'}); "
                        "unprivileged user namespaces may be off (sysctl kernel.unprivileged_userns_clone, or "
                        "AppArmor's restriction on Ubuntu 24.04 and later)")
    elif not bwrap:
        problems.append("bubblewrap is missing (Debian/Ubuntu: apt-get install bubblewrap): student code is NOT "
                        "confined to an allow-list of the filesystem, and has the network")
    else:
        problems.append(f"--isolation {requested}: bubblewrap is NOT used: student code is not confined to an "
                        "allow-list of the filesystem, and has the network")
    if requested == "bwrap":
        raise SystemExit("error: --isolation bwrap, but bubblewrap cannot be used here: " + problems[-1])
    prefix = unshare_prefix(root) if requested in ("auto", "unshare") else None
    if prefix:
        problems.append("falling back to hiding folders with a mount namespace: the solutions, the submissions, the "
                        "hidden tests and the gradebook are hidden, but any OTHER copy of the course on this "
                        "machine (a second checkout, a backup, a copy in /tmp or a home folder) is readable by "
                        "student code")
        return "unshare", None, prefix
    if requested == "unshare":
        raise SystemExit("error: --isolation unshare, but no mount namespace can be made here")
    problems.append("no mount namespace either: the solutions and hidden tests are hidden from student code only "
                    "by file permissions")
    return "none", None, None


def detect_isolation(requested: str = "auto", memory: str = "auto") -> Isolation:
    """What this machine allows; `requested` (auto, bwrap, unshare, none) and `memory` (auto, cgroup, watchdog) force."""
    linux = sys.platform.startswith("linux")
    root = linux and os.geteuid() == 0
    problems: list[str] = []
    if not linux:
        problems.append("not Linux: no sandbox, no user per student, no resource limits beyond what the OS gives")
    mode, bwrap, prefix = _choose_mode(requested, root, problems) if linux else ("none", None, None)
    users = root
    if root and mode == "none" and python_unreachable_by_others():
        users = False
        problems.append(f"Python ({sys.base_prefix}) lies in a folder other users cannot enter and no sandbox can "
                        "open it: student code runs as root, with only resource limits")
    if not root and mode == "bwrap":
        problems.append("not running as root: student code runs as your own user, inside the sandbox (it sees only "
                        "the allow-list and none of your processes); no user of its own, no limit on its number of "
                        "processes")
    elif not root:
        problems.append("not running as root and no sandbox: student code runs as your own user and can read and "
                        "change every file you can that is not hidden, signal the judge, and overwrite its report. "
                        "Grade as root (e.g. in a container) for full isolation.")
    cgroup = detect_cgroup() if linux else None
    usable = cgroup is not None and cgroup.memory is not None
    if memory == "cgroup" and not usable:
        raise SystemExit("error: --memory-limiter cgroup, but no memory cgroup can be made here"
                         + (f" ({cgroup.problem})" if cgroup and cgroup.problem else ""))
    chosen = "cgroup" if usable and memory != "watchdog" else "watchdog"
    if chosen == "watchdog":
        why = ("--memory-limiter watchdog" if usable else
               (cgroup.problem if cgroup and cgroup.problem else "no cgroup file system"))
        problems.append(f"no memory cgroup ({why}): memory is bounded by a watchdog that polls resident memory every "
                        "0.1 s, so a fast allocation can pass the limit by up to about a gigabyte before it is killed")
    return Isolation(root=root, mode=mode, bwrap=bwrap, hide_command=prefix, users=users, memory=chosen,
                     cgroup=cgroup if chosen == "cgroup" else None, problems=problems)


def refuse_weak_isolation(isolation: Isolation, requested: str) -> str:
    """Why the grader will not grade without bubblewrap unless told to (--allow-weak-isolation), and how to fix it."""
    why = next((p for p in isolation.problems if "bubblewrap" in p), "bubblewrap is not used")
    why = why.split(": ", 1)[1] if why.startswith("--isolation") else why  # the message names the option once
    asked = f"--isolation {requested}" + (f" (it fell back to {isolation.mode})" if requested == "auto" else "")
    return (f"error: {asked}: refusing to grade without bubblewrap's sandbox. {why}.\n"
            "Without it, student code can read any other copy of the course on this machine (a second checkout, a "
            "backup, a copy in /tmp) and reach the network, and a submission that copies the solutions gets full "
            "marks.\nInstall it (Debian/Ubuntu: apt-get install bubblewrap) and grade again, or pass "
            "--allow-weak-isolation to grade with the weaker isolation anyway: every row of grades.csv then says "
            "which isolation graded it, and OUT/summary.md lists the files student code opened outside what it may "
            "read.")


def default_rlimit_as_gb() -> float:
    """6 GiB of address space per student process (importing torch takes 3.3), or none where CUDA is present."""
    return 0.0 if os.path.exists("/dev/nvidiactl") else 6.0


def gpu_present() -> bool:
    return os.path.exists("/dev/nvidiactl")
