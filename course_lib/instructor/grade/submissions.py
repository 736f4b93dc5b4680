"""Reading submissions: only exNN_*.py regular files, never links, never anything else.

A submission is a folder or a .zip: a student's copy of exercises/, or of a whole course folder that
contains one. A submitted conftest.py, pytest.ini, tests/ or solutions/ is never looked at.
"""

from __future__ import annotations

import os
import re
import stat
import zipfile
from pathlib import Path

EXERCISE_FILE = re.compile(r"^(ex\d+)_\w*\.py$")  # what is taken from a submission, and nothing else
MAX_FILE_BYTES = 2**20  # one exercise file
MAX_FILES = 64


class SubmissionError(Exception):
    """A submission that cannot be read (a broken zip, for example)."""


def _safe_name(name: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9._@-]+", "_", name).strip("._") or "student"
    candidate, n = base, 2
    while candidate.lower() in taken:
        candidate, n = f"{base}-{n}", n + 1
    taken.add(candidate.lower())
    return candidate


def find_submissions(folder: Path) -> list[tuple[str, Path]]:
    """(student name, path) for every folder or .zip in `folder`, sorted by name."""
    entries, taken = [], set()
    for path in sorted(folder.iterdir(), key=lambda p: p.name.lower()):
        if path.name.startswith(".") or path.is_symlink():
            continue
        if path.is_dir():
            entries.append((_safe_name(path.name, taken), path))
        elif path.is_file() and path.suffix.lower() == ".zip":
            entries.append((_safe_name(path.stem, taken), path))
    return entries


def _read_plain_file(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SubmissionError(f"{path.name} is not a plain file")
        if info.st_size > MAX_FILE_BYTES:
            raise SubmissionError(f"{path.name} is larger than {MAX_FILE_BYTES // 1024} KiB")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def collect_exercise_files(entry: Path) -> tuple[dict[str, bytes], str]:
    """The student's exNN_*.py files (name -> bytes) and where in the submission they were found."""
    if entry.is_file():
        return _collect_from_zip(entry)
    candidates = [entry, entry / "exercises"]
    try:
        subfolders = sorted(p for p in entry.iterdir() if _is_real_dir(p) and not p.name.startswith("."))
    except OSError as error:
        raise SubmissionError(f"cannot list the folder: {error}") from None
    candidates += [p / "exercises" for p in subfolders] + subfolders
    for folder in candidates:
        if not _is_real_dir(folder) or folder.name in {"solutions", "tests"}:
            continue
        names = sorted(p.name for p in folder.iterdir() if EXERCISE_FILE.match(p.name))
        files = {}
        for name in names[:MAX_FILES]:
            if (folder / name).is_symlink():
                continue  # a link could point at the solutions: never followed
            files[name] = _read_plain_file(folder / name)
        if files:
            return files, str(folder.relative_to(entry)) if folder != entry else "."
    return {}, ""


def _collect_from_zip(path: Path) -> tuple[dict[str, bytes], str]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise SubmissionError(f"cannot open {path.name} as a zip file: {error}") from None
    with archive:
        by_folder: dict[str, list[zipfile.ZipInfo]] = {}
        for info in archive.infolist():
            parts = [p for p in info.filename.replace("\\", "/").split("/") if p not in ("", ".")]
            if not parts or ".." in parts or info.is_dir() or not EXERCISE_FILE.match(parts[-1]):
                continue
            if stat.S_ISLNK(info.external_attr >> 16) or "__MACOSX" in parts:
                continue
            folder = "/".join(parts[:-1])
            if any(p in {"solutions", "tests"} for p in parts[:-1]):
                continue
            by_folder.setdefault(folder, []).append(info)
        if not by_folder:
            return {}, ""

        def preference(folder: str):
            parts = folder.split("/") if folder else []
            return (0 if (parts and parts[-1] == "exercises") or not parts else 1, len(parts), folder)

        folder = min(by_folder, key=preference)
        files = {}
        for info in sorted(by_folder[folder], key=lambda i: i.filename)[:MAX_FILES]:
            if info.file_size > MAX_FILE_BYTES:
                raise SubmissionError(f"{info.filename} is larger than {MAX_FILE_BYTES // 1024} KiB")
            try:
                with archive.open(info) as member:
                    data = member.read(MAX_FILE_BYTES + 1)
            except (zipfile.BadZipFile, OSError, RuntimeError, ValueError) as error:
                raise SubmissionError(f"cannot read {info.filename} from {path.name}: {error}") from None
            if len(data) > MAX_FILE_BYTES:
                raise SubmissionError(f"{info.filename} is larger than {MAX_FILE_BYTES // 1024} KiB")
            files[info.filename.replace("\\", "/").split("/")[-1]] = data
        return files, folder or "."
