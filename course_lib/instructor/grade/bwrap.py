"""The student's sandbox: an allow-list of the filesystem, no network, its own pids (bubblewrap).

The judge is trusted and runs outside; only its fork server, and so every rank, runs in the sandbox:

    grader ─ judge: pytest (tests, hidden tests, its report: none of them exist in the sandbox)
               └─ sandboxed-python: moves itself into the student's cgroups, then exec bwrap ... python
                    └─ fork server (torch preloaded) ─ rank, rank, ... (as root: the student's own user)

What exists in the sandbox: /usr and its merged-/usr links, a few files of /etc, Python and its packages
(read-only), the course library (read-only, without solutions/), the student's scratch folder, a private
/tmp and /dev/shm, and the CUDA devices where there are some. Nothing else of the machine, whatever its
permissions: another copy of the course elsewhere is not there to be read.
"""

from __future__ import annotations

import glob
import os
import shlex
import site
import sys
from dataclasses import dataclass, field
from pathlib import Path

# A folder shown to student code must not contain any of these, a few levels down: binding a whole course
# checkout (an editable install can put one on sys.path) would show its solutions and its git history.
FORBIDDEN_MARKERS = ("solutions", ".git", "tests/hidden")
SYSTEM_FOLDERS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")  # besides /usr: merged-/usr links or folders
SYSTEM_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "localtime", "host.conf", "gai.conf",
              "alternatives")  # the files of /etc that libc and Python read


def _collapse(paths) -> list[Path]:
    """Resolved, existing folders, without the ones inside another."""
    kept: list[Path] = []
    for path in sorted({Path(p).resolve() for p in paths if p and os.path.isdir(p)}, key=lambda p: len(p.parts)):
        if not any(k == path or k in path.parents for k in kept):
            kept.append(path)
    return kept


def python_paths() -> list[Path]:
    """Folders Python and its packages need: the installations, the environment and its site-packages.

    Not every sys.path entry: sys.path[0] is a script's folder (often /tmp or a checkout), and an editable
    install adds a checkout's root, which holds the solutions. Only site-packages folders (also those a
    .pth file adds, e.g. an environment layered on another) and the prefixes.
    """
    candidates = [sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages()]
    candidates += [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    return [p for p in _collapse(candidates) if p != Path("/")
            and not any((p / marker).exists() for marker in FORBIDDEN_MARKERS)]


def _links_on_the_way(path: str) -> list[tuple[str, str]]:
    """(target, link) for each symbolic link along `path` (a venv that is a link to another, say)."""
    links, current = [], Path("/")
    for part in Path(path).parts[1:]:
        current = current / part
        if current.is_symlink():
            links.append((os.readlink(current), str(current)))
            current = current.resolve()
    return links


@dataclass
class SandboxSpec:
    """What one student's sandbox holds besides the system's libraries and Python."""

    read_only: list[Path]  # e.g. the course library (course_lib/), never a whole checkout
    writable: list[Path]  # the student's scratch folder (their files, the launches' rendezvous)
    etc_folder: Path | None = None  # hosts, passwd and group written for the sandbox (write_sandbox_etc)
    secrets: list[Path] = field(default_factory=list)  # must not be inside anything shown (checked)
    tmp_bytes: int = 256 * 2**20  # size of the private /tmp and of /dev/shm (tmpfs, counted by a memory cgroup)
    python: bool = True  # show python_paths()
    network: bool = False  # True keeps the host's network (never for student code)


def check_allow_list(paths: list[Path], secrets: list[Path] = (), depth: int = 3) -> None:
    """Refuse to show student code a folder that holds a secret, solutions, hidden tests or a git history."""
    for path in (Path(p).resolve() for p in paths):
        for secret in (Path(s).resolve() for s in secrets):
            if path == secret or path in secret.parents:
                raise ValueError(f"refusing to show {path} to student code: it contains {secret}")
        if not path.is_dir():
            continue
        for folder, subfolders, _ in os.walk(path):
            for marker in FORBIDDEN_MARKERS:
                if (Path(folder) / marker).exists():
                    raise ValueError(f"refusing to show {path} to student code: it contains {Path(folder) / marker}")
            if len(Path(folder).relative_to(path).parts) >= depth:
                subfolders.clear()


def _system_binds() -> list[str]:
    """/usr and its merged-/usr links, read-only; the few files of /etc that libc and Python read."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_FOLDERS:
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    for name in SYSTEM_ETC:
        if (Path("/etc") / name).exists():
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return args


def _gpu_binds() -> list[str]:
    """The CUDA devices and what the driver reads. Not yet run on a GPU machine."""
    args = []
    for device in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri/*")):
        args += ["--dev-bind", device, device]
    if args:
        args += ["--ro-bind", "/sys", "/sys"]  # NVML and CUDA read the PCI topology there
        if os.path.exists("/proc/driver/nvidia"):
            args += ["--ro-bind", "/proc/driver/nvidia", "/proc/driver/nvidia"]
    return args


def bwrap_argv(spec: SandboxSpec, *, root: bool, bwrap: str = "bwrap") -> list[str]:
    """The bwrap command line, up to and including `--`, that confines what follows to `spec`.

    As root no user namespace is made, so uids keep their meaning and each rank can switch to the
    student's own user; the sandbox keeps only CAP_SETUID and CAP_SETGID. As another user, bwrap makes a
    user namespace (unprivileged bubblewrap) and student code runs as that user.
    """
    check_allow_list([*spec.read_only, *spec.writable], spec.secrets)
    args = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox"]
    if not spec.network:
        args.append("--unshare-net")  # a network namespace of its own: only loopback, which gloo needs
    if root:
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user", "--disable-userns"]  # and no user namespace of its own inside
    args += _system_binds()
    args += ["--proc", "/proc", "--dev", "/dev"]
    for tmp in ("/tmp", "/dev/shm"):  # --perms and --size apply to the NEXT --tmpfs; 1777: the student writes there
        args += ["--perms", "1777", "--size", str(spec.tmp_bytes), "--tmpfs", tmp]
    if spec.etc_folder is not None:
        for name in sorted(os.listdir(spec.etc_folder)):
            args += ["--ro-bind", str(spec.etc_folder / name), f"/etc/{name}"]
    if os.path.exists("/dev/nvidiactl"):
        args += _gpu_binds()
    binds = [("--ro-bind", p) for p in (python_paths() if spec.python else [])]
    binds += [("--ro-bind", Path(p).resolve()) for p in spec.read_only]
    binds += [("--bind", Path(p).resolve()) for p in spec.writable]
    shown = [p for _, p in binds]
    links = [(target, link) for target, link in (_links_on_the_way(sys.executable) if spec.python else [])
             if not any(folder == Path(link) or folder in Path(link).parents for folder in shown)]
    # bwrap 0.8, as root, makes the folders above a bind mode 700: the student's user could not even reach
    # Python under /root/.pyenv. Make them first, world-traversable.
    made = {Path("/"), Path("/tmp"), Path("/usr"), Path("/etc"), Path("/proc"), Path("/dev")}
    for path in [p for _, p in binds] + [Path(link) for _, link in links]:
        for parent in reversed(path.parents):
            if parent not in made:
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
    for flag, path in binds:
        args += [flag, str(path), str(path)]
    for target, link in links:
        args += ["--symlink", target, link]
    return args + ["--"]


def readable_paths(spec: SandboxSpec, private_tmp: bool) -> list[str]:
    """What student code may open: what `bwrap_argv(spec)` shows (and /sys, /dev whole), for the audit hook that
    records every other file it opens (Confinement.read_allowed). `private_tmp`: /tmp is the sandbox's own."""
    paths = ["/usr", *(f"/{name}" for name in SYSTEM_FOLDERS), "/dev", "/sys",
             *(f"/etc/{name}" for name in (*SYSTEM_ETC, "hosts", "passwd", "group"))]
    if private_tmp:
        paths.append("/tmp")
    if spec.python:
        shown = python_paths()
        paths += [str(p) for p in shown]
        # Python names its folders as they were given (a venv's link, say): those names too, where they lead in.
        raw = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages(),
               *(p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages"))]
        for name in raw:
            real = Path(name).resolve()
            if any(real == folder or folder in real.parents for folder in shown):
                paths.append(os.path.abspath(name))
    for folder in [*spec.read_only, *spec.writable]:
        paths += [os.path.abspath(folder), str(Path(folder).resolve())]
    return list(dict.fromkeys(paths))


def write_sandbox_etc(folder: Path, uid: int | None) -> Path:
    """hosts, passwd and group for the sandbox: its host name resolves to loopback (gloo needs that)."""
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    (folder / "hosts").write_text("127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost\n")
    users = ["root:x:0:0:root:/root:/usr/sbin/nologin", "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin"]
    groups = ["root:x:0:", "nogroup:x:65534:"]
    for number in sorted({u for u in (uid, os.getuid()) if u not in (None, 0, 65534)}):
        users.append(f"student{number}:x:{number}:{number}:student:/tmp:/usr/sbin/nologin")
        groups.append(f"student{number}:x:{number}:")
    (folder / "passwd").write_text("\n".join(users) + "\n")
    (folder / "group").write_text("\n".join(groups) + "\n")
    for name in ("hosts", "passwd", "group"):
        os.chmod(folder / name, 0o644)
    return folder


def write_sandboxed_python(path: Path, bwrap: list[str], cgroup_procs: list[Path] = ()) -> Path:
    """The executable that multiprocessing starts the fork server with: `python "$@"` in the sandbox.

    With `cgroup_procs` it first moves itself into those cgroups, so the sandbox and everything in it
    is charged there and nothing of the judge is. With no `bwrap` it only does that (the fallback).
    """
    lines = ["#!/bin/sh", "# written by the grader: the fork server of one student's judge runs in this sandbox"]
    lines += [f"echo $$ > {shlex.quote(str(procs))} || exit 121" for procs in cgroup_procs]
    lines.append("exec " + " ".join(shlex.quote(a) for a in [*bwrap, sys.executable]) + ' "$@"')
    path.write_text("\n".join(lines) + "\n")
    os.chmod(path, 0o700)
    return path
