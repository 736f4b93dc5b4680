"""What protects the grader on this machine: users per student, mount namespaces, killing what is left.

`detect_sandbox()` finds out once, at the start of a grading run, and `Sandbox.describe()` says it
aloud, with a WARNING line for every protection this machine cannot give.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.paths import ROOT

UID_BASE = 64000  # first of the users the students' code runs as (when the grader is root)


@dataclass
class Sandbox:
    """The isolation this machine allows, and what is missing (said once, at the start)."""

    root: bool
    hide_command: list[str] | None  # prefix that runs a command in a new mount namespace
    missing: list[str] = field(default_factory=list)
    users: bool = False  # each student's code runs as a user of its own (needs root)

    def describe(self) -> str:
        have = ["a judge process apart from student code", "limits on memory, processes and file size",
                "time limits per test and per student"]
        if self.users:
            have.append("a user of its own for each student's code")
        if self.hide_command:
            have.append("solutions, submissions, hidden tests and the gradebook hidden by a mount namespace")
        text = "protections: " + "; ".join(have)
        for line in self.missing:
            text += f"\nWARNING: {line}"
        return text


def detect_sandbox() -> Sandbox:
    root = sys.platform.startswith("linux") and os.geteuid() == 0
    missing = []
    if not sys.platform.startswith("linux"):
        missing.append("not Linux: no resource limits for student code beyond what the OS gives, no parent-death signal")
    if not root:
        missing.append(
            "not running as root: student code runs as your own user, so it could read the solutions and hidden "
            "tests (unless hidden below), change the course's files, or overwrite the judge's report. "
            "Grade as root (e.g. in a container) for full isolation.")
    hide = None
    if sys.platform.startswith("linux") and shutil.which("unshare") and shutil.which("mount"):
        prefix = ["unshare", "--mount"] if root else ["unshare", "--map-root-user", "--mount"]
        with tempfile.TemporaryDirectory() as probe:
            secret = Path(probe) / "secret"
            secret.mkdir()
            (secret / "file").write_text("x")
            script = f"mount -t tmpfs -o size=16k,mode=0555 none {shlex.quote(str(secret))} && test ! -e {shlex.quote(str(secret / 'file'))}"
            try:
                ok = subprocess.run([*prefix, "sh", "-c", script], capture_output=True, timeout=30).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
        hide = prefix if ok else None
    users = root
    if root and hide is None and any(_blocked_ancestor(p) for p in _needed_paths(Path(tempfile.gettempdir()))):
        users = False
        missing.append(f"Python ({sys.base_prefix}) lies in a folder other users cannot enter and no mount namespace "
                       "can be made to open it: student code runs as root, with only resource limits")
    if hide is None:
        missing.append("no mount namespace (`unshare --mount` failed or is missing): the solutions, the other "
                       "submissions and the hidden tests are hidden from student code only by file permissions")
    return Sandbox(root=root, hide_command=hide, missing=missing, users=users)


def free_uids(count: int, base: int = UID_BASE) -> list[int]:
    """`count` user ids that no account uses: each running student gets its own."""
    taken = {entry.pw_uid for entry in pwd.getpwall()}
    uids, uid = [], base
    while len(uids) < count:
        if uid not in taken:
            uids.append(uid)
        uid += 1
    return uids


def kill_user(uid: int) -> None:
    """SIGKILL every process of `uid` (a student's user): nothing it started survives its grading.

    kill(-1) sent as that user reaches every process it owns, however it left its session or parent.
    """
    kill = shutil.which("kill") or "/bin/kill"
    deadline = time.monotonic() + 10
    while processes_of(uid) and time.monotonic() < deadline:
        subprocess.run([kill, "-9", "-1"], user=uid, group=uid, extra_groups=[],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        time.sleep(0.2)  # SIGKILL is delivered, and the processes leave /proc, a moment later


def processes_of(uid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _blocked_ancestor(path: Path) -> Path | None:
    """The first folder above or at `path` that other users cannot pass through (mode without o+x)."""
    for folder in [*reversed(path.parents), path]:
        try:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return folder
        except OSError:
            return None
    return None


def _needed_paths(work: Path) -> list[Path]:
    """What the judge and the students' processes must reach: Python, its packages, the course, the scratch."""
    paths = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), ROOT, work.resolve()}
    paths |= {Path(p).resolve() for p in sys.path if p and os.path.isdir(p)}
    kept = []
    for path in sorted(paths, key=lambda p: len(p.parts)):
        if not any(k == path or k in path.parents for k in kept):
            kept.append(path)
    return kept


def namespace_prefix(sandbox: Sandbox, hide: list[Path], work: Path) -> list[str]:
    """Prefix that runs the judge in a mount namespace where `hide` are empty folders.

    Python often lives in a folder other users cannot enter (pyenv or conda under /root): there an
    empty tmpfs replaces that folder, and only what the judge needs is mounted back into it, so the
    students' user can import Python's modules but sees nothing else of the instructor's home.
    """
    if not sandbox.hide_command:
        return []
    needed = _needed_paths(work)
    steps = []
    blocked: dict[Path, list[Path]] = {}
    if sandbox.root:
        for path in needed:
            ancestor = _blocked_ancestor(path)
            if ancestor is not None:
                blocked.setdefault(ancestor, []).append(path)
        stage = work / "stage"
        for n, (ancestor, paths) in enumerate(sorted(blocked.items())):
            for m, path in enumerate(paths):
                staged = stage / f"{n}-{m}"
                steps.append(f"mkdir -p {shlex.quote(str(staged))} && mount --bind {shlex.quote(str(path))} {shlex.quote(str(staged))}")
        for n, (ancestor, paths) in enumerate(sorted(blocked.items())):
            steps.append(f"mount -t tmpfs -o size=1m,mode=0755 none {shlex.quote(str(ancestor))}")
            for m, path in enumerate(paths):
                staged = stage / f"{n}-{m}"
                steps.append(f"mkdir -p {shlex.quote(str(path))} && mount --bind {shlex.quote(str(staged))} {shlex.quote(str(path))}")
    replaced = list(blocked) if sandbox.root else []
    for path in hide:
        path = path.resolve()
        if not path.is_dir() or any(k == path or path in k.parents for k in needed):
            continue  # hiding it would hide the judge's own files
        if any(a == path or a in path.parents for a in replaced) and not any(k in path.parents for k in needed):
            continue  # already gone: its folder was replaced by an empty one above
        steps.append(f"mount -t tmpfs -o size=16k,mode=0555 none {shlex.quote(str(path))}")
    if not steps:
        return []
    return [*sandbox.hide_command, "sh", "-c", " && ".join(steps) + ' && exec "$@"', "sh"]


_running: dict[int, tuple[subprocess.Popen, int | None]] = {}  # judges now running: stopped if the grader is


def default_memory_gb() -> float:
    """6 GiB of address space per student process (importing torch takes 3.3), or none where CUDA is present."""
    return 0.0 if os.path.exists("/dev/nvidiactl") else 6.0
