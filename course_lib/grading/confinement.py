"""The grader's policy for processes that run a student's code: limits, user, working folder (the instructor's tool).

The grader writes a `Confinement` to a file and starts its judge with `pytest --confine FILE`; the
judge's runner hands it to every launch, and each rank calls `apply()` before it loads any of the
student's code. Learners' own launches carry none.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Confinement"]


@dataclass
class Confinement:
    """Limits on every process that runs a student's code (0 or None: no limit)."""

    memory_bytes: int = 0  # address space (RLIMIT_AS)
    max_processes: int = 0  # processes and threads of the user (RLIMIT_NPROC)
    file_bytes: int = 0  # largest file it may write (RLIMIT_FSIZE)
    cwd: str | None = None  # its working folder: the student's scratch folder
    uid: int | None = None  # an unprivileged user of its own (only when the grader runs as root)
    gid: int | None = None

    def to_file(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(asdict(self)))

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Confinement":
        return cls(**json.loads(Path(path).read_text()))

    def prepare_folder(self, folder: str) -> None:
        """Let the confined ranks reach a folder the launcher made for them (the rendezvous file)."""
        if self.uid is not None and hasattr(os, "geteuid") and os.geteuid() == 0:
            os.chown(folder, self.uid, self.gid if self.gid is not None else self.uid)

    def apply(self) -> None:
        """In the rank, before any student code runs: set the limits, change folder, drop to the student's user."""
        import resource

        for limit, value in ((resource.RLIMIT_AS, self.memory_bytes), (resource.RLIMIT_NPROC, self.max_processes),
                             (resource.RLIMIT_FSIZE, self.file_bytes)):
            if value:
                resource.setrlimit(limit, (value, value))
        if self.cwd:
            os.chdir(self.cwd)
        if self.uid is not None and os.getuid() == 0:
            from course_lib.dist.rank import die_with_parent

            os.setgroups([])
            os.setgid(self.gid if self.gid is not None else self.uid)
            os.setuid(self.uid)
            die_with_parent()  # Linux clears the parent-death signal when the user changes: set it again
