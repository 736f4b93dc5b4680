"""The users students' code runs as (when the grader is root): one per student graded at once, never shared.

Several graders may run on one machine (two instructors, or a grader and its own tests). Each user id is
claimed under a lock (`flock` on a file per uid in a folder only root can write), and uids that an
account uses or that own a live process are skipped, so no grader runs, or kills, another's students.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

UID_BASE = int(os.environ.get("COURSE_GRADE_UID_BASE", "64000"))  # first of the students' users
LOCKS = Path("/run/lock/course-grade")  # a file per claimed uid, locked while it is in use


class UidClaim:
    """User ids held by this grader until `release()` (or its exit: the kernel drops the locks)."""

    def __init__(self, count: int, base: int = UID_BASE, locks: Path = LOCKS):
        locks.mkdir(mode=0o700, parents=True, exist_ok=True)
        if locks.stat().st_uid != 0 or locks.stat().st_mode & 0o022:
            raise RuntimeError(f"{locks} must belong to root and be writable only by it")
        taken = {entry.pw_uid for entry in pwd.getpwall()}
        self.uids: list[int] = []
        self._handles = []
        uid = base
        while len(self.uids) < count:
            if uid not in taken:
                handle = open(locks / f"uid-{uid}", "a")
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # another grader holds it
                    handle.close()
                else:
                    if processes_of(uid):  # a grader that takes no locks (an older one) is using it
                        handle.close()
                    else:
                        self.uids.append(uid)
                        self._handles.append(handle)
            uid += 1

    def release(self) -> None:
        for handle in self._handles:
            handle.close()
        self._handles = []


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
