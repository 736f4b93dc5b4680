"""The fallback where bubblewrap is missing: the judge in a mount namespace with the known secrets hidden.

A deny-list, said aloud as one by the grader: the course's solutions, the submissions, the hidden tests
and the gradebook become empty folders, but any other copy of the course on this machine stays readable
by student code, and the network stays open. Made with `unshare --mount` as root, `unshare -r -m` without.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from course_lib.paths import ROOT


def unshare_prefix(root: bool) -> list[str] | None:
    """The command prefix that runs a command in a mount namespace of its own, if one can be made here."""
    if not sys.platform.startswith("linux") or not shutil.which("unshare") or not shutil.which("mount"):
        return None
    prefix = ["unshare", "--mount"] if root else ["unshare", "--map-root-user", "--mount"]
    with tempfile.TemporaryDirectory() as probe:
        secret = Path(probe) / "secret"
        secret.mkdir()
        (secret / "file").write_text("x")
        script = (f"mount -t tmpfs -o size=16k,mode=0555 none {shlex.quote(str(secret))} "
                  f"&& test ! -e {shlex.quote(str(secret / 'file'))}")
        try:
            ok = subprocess.run([*prefix, "sh", "-c", script], capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
    return prefix if ok else None


def python_unreachable_by_others() -> bool:
    """Whether Python, its packages or the course lie in a folder other users cannot enter (pyenv under /root)."""
    return any(_blocked_ancestor(p) for p in _needed_paths(Path(tempfile.gettempdir())))


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


def namespace_prefix(prefix: list[str] | None, root: bool, hide: list[Path], work: Path) -> list[str]:
    """Prefix that runs the judge in a mount namespace where `hide` are empty folders.

    Python often lives in a folder other users cannot enter (pyenv or conda under /root): there an
    empty tmpfs replaces that folder, and only what the judge needs is mounted back into it, so the
    students' user can import Python's modules but sees nothing else of the instructor's home.
    """
    if not prefix:
        return []
    needed = _needed_paths(work)
    steps = []
    blocked: dict[Path, list[Path]] = {}
    if root:
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
    replaced = list(blocked) if root else []
    for path in hide:
        path = path.resolve()
        if not path.is_dir() or any(k == path or path in k.parents for k in needed):
            continue  # hiding it would hide the judge's own files
        if any(a == path or a in path.parents for a in replaced) and not any(k in path.parents for k in needed):
            continue  # already gone: its folder was replaced by an empty one above
        steps.append(f"mount -t tmpfs -o size=16k,mode=0555 none {shlex.quote(str(path))}")
    if not steps:
        return []
    return [*prefix, "sh", "-c", " && ".join(steps) + ' && exec "$@"', "sh"]
