"""What a student submitted to Gradescope: the exercise files found in it, and what is wrong with it (the
instructor's tool; read inside Gradescope's container by container.py).

`read_submission` takes the exercises/ folder's files, the whole course folder, or a zip of either; it names a
missing file, one named differently (ex05_ddp (1).py) with the name it should have, and one that does not
compile, which it compiles (never runs) in a process of its own.
"""

from __future__ import annotations

import difflib
import itertools
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

EXERCISE_NAME = re.compile(r"^ex\d\d_\w+\.py$")
MAX_LISTED = 2000  # names looked at in one submission, to say what a misnamed file should be called


@dataclass
class Submission:
    """What a student submitted: the exercise files taken, where they were, and what is wrong with it."""

    files: dict[str, bytes] = field(default_factory=dict)
    found_in: str = ""
    problems: list[str] = field(default_factory=list)  # for the top of results.json's output


def _all_names(folder: Path) -> list[str]:
    """Every file name in the submission (inside zips too), for suggestions: names only, nothing is read."""
    names: list[str] = []
    for path in sorted(itertools.islice(folder.rglob("*"), MAX_LISTED)):
        if path.is_file() and not path.is_symlink():
            names.append(path.name)
            if path.suffix.lower() == ".zip":
                try:
                    with zipfile.ZipFile(path) as archive:
                        names += [n.rstrip("/").rsplit("/", 1)[-1] for n in archive.namelist()[:MAX_LISTED]]
                except (zipfile.BadZipFile, OSError):
                    pass
    return [n for n in names if n]


def _near(expected: str, names: list[str]) -> list[str]:
    """Submitted names that look like `expected` (ex05_ddp (1).py, Ex05_DDP.py, ex05-ddp.py, ex05_mine.py)."""
    prefix = expected[:4].lower()
    squashed = re.sub(r"[^a-z0-9]", "", expected.lower())
    found = [n for n in names if n != expected and (n.lower().startswith(prefix) or
                                                      squashed in re.sub(r"[^a-z0-9]", "", n.lower()))]
    found += difflib.get_close_matches(expected, [n for n in names if n != expected], n=3, cutoff=0.75)
    return list(dict.fromkeys(found))[:3]


def read_submission(folder: Path, expected_files: list[str]) -> Submission:
    """The exercise files of a Gradescope submission folder: loose files, a course folder, or a zip of either."""
    from course_lib.instructor.grade.submissions import SubmissionError, collect_exercise_files

    submission = Submission()
    try:
        submission.files, submission.found_in = collect_exercise_files(folder)
        if not submission.files:
            for archive in sorted(itertools.islice(folder.rglob("*.zip"), 5)):
                if archive.is_file() and not archive.is_symlink():
                    files, inside = collect_exercise_files(archive)
                    if files:
                        found_in = archive.relative_to(folder).as_posix() + (f"/{inside}" if inside != "." else "")
                        submission.files, submission.found_in = files, found_in
                        break
    except (SubmissionError, OSError) as error:
        submission.problems.append(f"Your submission could not be read: {error}.")
    names = _all_names(folder)
    for expected in expected_files:
        if expected in submission.files:
            continue
        exercise = expected.split("_", 1)[0]
        near = _near(expected, names)
        if near:
            shown = ", ".join(f"'{n}'" for n in near)
            submission.problems.append(f"{expected} is missing, and your submission has {shown}: rename it to "
                                       f"{expected} and submit again. The tests of {exercise} count as failed.")
        else:
            submission.problems.append(f"{expected} is missing from your submission: the tests of {exercise} count "
                                       "as failed.")
    unexpected = sorted(set(submission.files) - set(expected_files))
    for name in unexpected:
        submission.files.pop(name)  # ex05_mine.py: no test imports it (said above, as a near name)
    for name, message in _syntax_errors(submission.files).items():
        submission.problems.append(f"{name} does not compile, so the tests of {name.split('_', 1)[0]} count as "
                                   f"failed: {message}")
    if any(expected not in submission.files for expected in expected_files):
        submission.problems.append("Submit your exercises/ folder's files (ex00_warmup.py, ...), the whole course "
                                   "folder, or a zip of either.")
    return submission


_COMPILE = """
import json, sys
errors = {}
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as handle:
            compile(handle.read(), path.rsplit("/", 1)[-1], "exec", dont_inherit=True)
    except SyntaxError as error:
        where = f"line {error.lineno}" + (f", column {error.offset}" if error.offset else "")
        text = (error.text or "").strip()
        errors[path.rsplit("/", 1)[-1]] = f"{type(error).__name__}: {error.msg} ({where})" + (f": {text[:200]}" if text else "")
    except (ValueError, RecursionError, MemoryError) as error:
        errors[path.rsplit("/", 1)[-1]] = f"{type(error).__name__}: {str(error)[:200]}"
print(json.dumps(errors))
"""


def _syntax_errors(files: dict[str, bytes]) -> dict[str, str]:
    """name -> the compiler's message, for each file that does not compile. Compiled (never run) in a process of
    its own, so that a file that crashes the compiler (nesting thousands deep) costs its own tests, not the grader."""
    if not files:
        return {}
    with tempfile.TemporaryDirectory(prefix="course-compile-") as folder:
        paths = []
        for name, data in files.items():
            (Path(folder) / name).write_bytes(data)
            paths.append(str(Path(folder) / name))
        try:
            done = subprocess.run([sys.executable, "-I", "-c", _COMPILE, *paths], capture_output=True, text=True,
                                  timeout=60, stdin=subprocess.DEVNULL)
            return json.loads(done.stdout) if done.returncode == 0 else _one_by_one(paths)
        except (subprocess.TimeoutExpired, ValueError):
            return _one_by_one(paths)


def _one_by_one(paths: list[str]) -> dict[str, str]:
    errors = {}
    for path in paths:
        try:
            done = subprocess.run([sys.executable, "-I", "-c", _COMPILE, path], capture_output=True, text=True,
                                  timeout=30, stdin=subprocess.DEVNULL)
            errors.update(json.loads(done.stdout) if done.returncode == 0 else
                          {Path(path).name: f"the Python compiler crashed on it (exit code {done.returncode})"})
        except (subprocess.TimeoutExpired, ValueError):
            errors[Path(path).name] = "the Python compiler did not finish compiling it within 30 s"
    return errors
