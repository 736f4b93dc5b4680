"""The grader's policy for processes that run a student's code: sandbox, limits, user, folder (the instructor's tool).

The grader writes a `Confinement` to a file and starts its judge with `pytest --confine FILE`; the
judge's runner hands it to every launch. The launcher forks the ranks from a fork server started
through `fork_server_executable` (the grader's sandbox, when it has one), and each rank calls
`apply()` before it loads any of the student's code. Learners' own launches carry none.
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

    rlimit_as_bytes: int = 0  # address space of each process (RLIMIT_AS); 0 where CUDA runs (it reserves more)
    max_processes: int = 0  # processes and threads of the student's user (RLIMIT_NPROC; only with a user of its own)
    file_bytes: int = 0  # largest file it may write (RLIMIT_FSIZE)
    cwd: str | None = None  # its working folder: the student's scratch folder
    uid: int | None = None  # an unprivileged user of its own (only when the grader runs as root)
    gid: int | None = None
    fork_server_executable: str | None = None  # runs the ranks' fork server in the student's sandbox
    memory_limit_bytes: int = 0  # all of the student's processes together (a memory cgroup or the watchdog)
    memory_cgroup: str | None = None  # that cgroup's folder: the judge reads its out-of-memory kills there
    memory_cgroup_version: int = 1
    memory_watchdog: bool = False  # no cgroup: the judge polls resident memory and kills above the limit
    gpu_memory_fraction: float = 0.0  # of each GPU, for PyTorch's caching allocator in each process
    # Files student code opens outside what it may read (the sandbox's allow-list) are appended to `read_log`:
    # a record for the instructor, which also catches what the fallback sandbox lets through (watch_opens).
    read_allowed: list[str] | None = None  # folders and files it may open; None: no watching
    read_log: str | None = None  # the grader's file, opened before the user switch (the student cannot reopen it)
    traceback_sources: list[str] | None = None  # the judge's tests: read by linecache for a traceback, not flagged
    # The host's folders under an allowed folder that the sandbox does not show (what was in the host's /tmp when
    # the sandbox's private /tmp hid it: a checkout of the course, another student's files): opening in them is
    # recorded, except where an allowed folder inside them covers it (the course's .venv bound into the sandbox).
    host_only: list[str] | None = None

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
        """In the rank, before any student code runs: limits, the student's user, then its folder."""
        import resource

        _volunteer_for_the_oom_killer()
        log = os.open(self.read_log, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC) if self.read_log else None
        for limit, value in ((resource.RLIMIT_AS, self.rlimit_as_bytes), (resource.RLIMIT_NPROC, self.max_processes),
                             (resource.RLIMIT_FSIZE, self.file_bytes)):
            if value:
                resource.setrlimit(limit, (value, value))
        if self.gpu_memory_fraction:
            _limit_gpu_memory(self.gpu_memory_fraction)
        if self.uid is not None and os.getuid() == 0:
            from course_lib.dist.rank import die_with_parent

            os.setgroups([])
            os.setgid(self.gid if self.gid is not None else self.uid)
            os.setuid(self.uid)
            die_with_parent()  # Linux clears the parent-death signal when the user changes: set it again
        if self.cwd:
            # After the switch: in the sandbox the fork server's root has no CAP_DAC_OVERRIDE, so only the
            # student's own user can enter its scratch folder (mode 700).
            os.chdir(self.cwd)
        if log is not None and self.read_allowed is not None:
            watch_opens(self.read_allowed, log, [self.cwd] if self.cwd else [], self.traceback_sources or [],
                        self.host_only or [])


def watch_opens(allowed: list[str], log_fd: int, writable: list[str] = (), quiet: list[str] = (),
                host_only: list[str] = ()) -> None:
    """Append every file this process opens outside `allowed` (and every program it runs) to `log_fd`, for good.

    `host_only`: folders inside an allowed one (the private /tmp) that are the host's and not the sandbox's: a path
    in one of them counts as outside unless an allowed folder within that folder holds it.

    An audit hook (PEP 578) cannot be removed once added. Per open: an absolute path and a prefix check; links
    are resolved only under `writable` folders and /proc, where student code could make them point anywhere.
    A tripwire, not a wall: reads through ctypes or another program are not seen; only the sandbox stops them.
    """
    import sys

    def folders(paths):
        return tuple(p.rstrip("/") + "/" for p in paths if p)

    inside = folders(allowed)
    # and sys.path's folders themselves (not what is in them): zipimport tries to open each as a zip file
    exact = frozenset([*(p.rstrip("/") for p in allowed if p), *(os.path.abspath(p) for p in sys.path)])
    resolve, quiet = folders([*writable, "/proc"]), folders(quiet)
    hidden = folders(host_only)
    # for each host-only folder, the allowed folders within it (or equal to it)
    shown_in = {h: tuple(a for a in inside if a.startswith(h)) for h in hidden}

    def allowed_path(path: str) -> bool:
        if path in exact:  # named one by one (sys.path's folders: the judge's tests, in the host's /tmp)
            return True
        for h in hidden:
            if path.startswith(h) or path == h.rstrip("/"):
                return path.startswith(shown_in[h]) if shown_in[h] else False
        return path.startswith(inside) or path in exact
    seen: set[str] = set()

    def note(kind: str, what: str) -> None:
        if what not in seen:
            seen.add(what)
            os.write(log_fd, f"{kind}\t{what}\n".encode("utf-8", "replace"))

    def hook(event: str, args: tuple) -> None:
        try:
            if event == "open":
                path = args[0]
                if path is None or isinstance(path, int):
                    return
                path = os.path.abspath(os.fsdecode(path))
                if path.startswith(resolve):
                    path = os.path.realpath(path)
                if allowed_path(path) or _own_proc(path):
                    return
                if path.startswith(quiet) and _from_linecache(sys._getframe(1)):
                    return  # a traceback's source line from the judge's tests: it fails in the sandbox
                note("opened", path)
            elif event in ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.system"):
                note("ran", os.fsdecode(args[0]) if isinstance(args[0], (str, bytes)) else repr(args[0]))
        except Exception:  # noqa: BLE001 - a hook that raises would fail the student's open
            pass

    sys.addaudithook(hook)


def _own_proc(path: str) -> bool:
    """/proc's files of this process or of none (/proc/self/..., /proc/meminfo), not another's (/proc/1/root/...)."""
    if not path.startswith("/proc/"):
        return False
    first = path[6:].split("/", 1)[0]
    return not first.isdigit() or first == str(os.getpid())


def _from_linecache(frame) -> bool:
    for _ in range(6):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith(("linecache.py", "tokenize.py")):
            return True
        frame = frame.f_back
    return False


def _volunteer_for_the_oom_killer() -> None:
    """When the student's memory cgroup is full, the kernel kills a rank, not the fork server the next tests need."""
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    except OSError:
        pass


def _limit_gpu_memory(fraction: float) -> None:
    """Cap PyTorch's caching allocator at `fraction` of each GPU, once (if ever) this process initialises CUDA.

    Queued with torch.cuda._lazy_call, so a rank that never touches CUDA creates no CUDA context. Advisory:
    code can raise the cap again or allocate outside PyTorch; only MIG or MPS bound a GPU's memory for real.
    """
    import torch

    def cap() -> None:
        for device in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(fraction, device)

    torch.cuda._lazy_call(cap)
