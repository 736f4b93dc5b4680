"""Grade a whole class: one row per student, safely and in bounded time (the instructor's tool).

    python -m course_lib.grade SUBMISSIONS --out OUT [--jobs N] [--timeout SECONDS]
                               [--test-timeout SECONDS] [--tests HIDDEN_TESTS_DIR] [--exercises ex00,ex01]

Each entry of SUBMISSIONS (a folder or a .zip) is one student's copy of exercises/, or of a whole
course folder that contains one. Writes OUT/grades.csv (one row per student), and for each student
OUT/<student>/results.json (Gradescope's schema), OUT/<student>/feedback.md and OUT/<student>/grading.log.

How a student is graded (the threat model is in the README's instructor section):

* Only the student's exNN_*.py files are copied, as plain files (no links), into a scratch folder;
  a submitted conftest.py, pytest.ini, tests/ or solutions/ is never looked at.
* A *judge* pytest process runs the course's own tests (and a copy of the hidden tests) with a
  trusted configuration, `--target <scratch>/exercises`. It never imports the student's code: the
  tests reach it through course_lib.runner, in child processes that get resource limits (address
  space, processes, file size) and, when the grader runs as root, switch to a user of their own,
  so they can read neither the solutions, the hidden tests, the other students' files nor the
  judge's report, and can write nowhere but their scratch folder. Where a mount namespace can be
  made, the solutions, the submissions, the hidden tests and OUT are also hidden behind empty mounts.
* Results cross from the student's processes only as plain data (torch.load(weights_only=True)).
  The judge writes its verdicts to a JSON report in a folder only it can write; this process reads
  only that report (and a line-per-test stream, so a judge killed at the time limit still counts
  the tests it finished).
* Every test has a time limit (--test-timeout), and every student one for the whole run (--timeout):
  then the judge's whole session is killed, and (as root) every process of the student's user.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import pwd
import queue
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["main", "grade_class", "Sandbox", "collect_exercise_files", "classify"]

EXERCISE_FILE = re.compile(r"^(ex\d+)_\w*\.py$")  # what is taken from a submission, and nothing else
TEST_FILE = re.compile(r"test_(ex\d+)")
MAX_FILE_BYTES = 2**20  # one exercise file
MAX_FILES = 64
STATUSES = ("ok", "timeout", "crashed", "grader error")
UID_BASE = 64000  # first of the users the students' code runs as (when the grader is root)


# ----------------------------------------------------------------------------------------------
# The judge's pytest plugin: loaded with `-p course_lib.grade` into the judge, never into student code.
# It writes one JSON line per finished test, so a judge killed at the time limit still has results.

_stream_config = None


def pytest_addoption(parser):
    parser.addoption("--grade-stream", default=None, help="(the grader) write one JSON line per finished test here")


def pytest_configure(config):
    global _stream_config
    _stream_config = config


def _stream_write(record: dict) -> None:
    path = _stream_config.getoption("--grade-stream") if _stream_config is not None else None
    if path:
        with open(path, "a", encoding="utf-8") as stream:
            stream.write(json.dumps(record) + "\n")


def pytest_collection_finish(session):
    collected = []
    for item in session.items:
        properties = dict(item.user_properties)
        collected.append({"nodeid": item.nodeid, "points": properties.get("points"),
                          "not_graded": properties.get("not_graded")})
    _stream_write({"collected": collected})


def pytest_runtest_logfinish(nodeid, location):
    entry = getattr(_stream_config, "course_results", {}).get(nodeid)
    if entry is not None:
        _stream_write({"test": entry})


# ----------------------------------------------------------------------------------------------
# What protects the grader on this machine.


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


def _free_uids(count: int, base: int = UID_BASE) -> list[int]:
    """`count` user ids that no account uses: each running student gets its own."""
    taken = {entry.pw_uid for entry in pwd.getpwall()}
    uids, uid = [], base
    while len(uids) < count:
        if uid not in taken:
            uids.append(uid)
        uid += 1
    return uids


def _kill_user(uid: int) -> None:
    """SIGKILL every process of `uid` (a student's user): nothing it started survives its grading.

    kill(-1) sent as that user reaches every process it owns, however it left its session or parent.
    """
    kill = shutil.which("kill") or "/bin/kill"
    deadline = time.monotonic() + 10
    while _processes_of(uid) and time.monotonic() < deadline:
        subprocess.run([kill, "-9", "-1"], user=uid, group=uid, extra_groups=[],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        time.sleep(0.2)  # SIGKILL is delivered, and the processes leave /proc, a moment later


def _processes_of(uid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    found.append(int(entry))
            except OSError:
                pass
    return found


# ----------------------------------------------------------------------------------------------
# Reading submissions: only exNN_*.py regular files, never links, never anything else.


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


# ----------------------------------------------------------------------------------------------
# The judge: a trusted copy of the tests, and one pytest process per student.

PYTEST_INI = """\
[pytest]
addopts =
markers =
    points(n): a graded test worth n points
    gpu(n): needs n CUDA GPUs; not graded where they are missing
"""


@dataclass
class Judge:
    """The trusted test tree shared by every student's judge, and the tests it runs."""

    folder: Path
    test_files: list[str]
    expected: list[dict]  # every graded test: nodeid, points, not_graded, exercise, hidden


def _exercise_of(nodeid: str) -> str:
    match = TEST_FILE.search(nodeid.split("::")[0].rsplit("/", 1)[-1])
    return match.group(1) if match else "other"


def _is_hidden(nodeid: str) -> bool:
    return nodeid.startswith("tests/hidden/")


def build_judge(work: Path, hidden: Path | None, exercises: list[str] | None) -> tuple[Path, list[str]]:
    """Copy the course's graded tests (and the hidden ones) into a folder only the grader can read."""
    folder = work / "judge"
    folder.mkdir(mode=0o700)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
    shutil.copytree(ROOT / "tests", folder / "tests",
                    ignore=lambda d, names: set(ignore(d, names)) | ({"course", "hidden"} if Path(d) == ROOT / "tests" else set()))
    if hidden is not None:
        shutil.copytree(hidden, folder / "tests" / "hidden", ignore=ignore)
    (folder / "pytest.ini").write_text(PYTEST_INI)
    tests = sorted(str(p.relative_to(folder)) for p in (folder / "tests").glob("test_ex*.py"))
    if hidden is not None:
        tests += sorted(str(p.relative_to(folder)) for p in (folder / "tests" / "hidden").rglob("test_*.py"))
    if exercises:
        tests = [t for t in tests if _exercise_of(t) in exercises]
    return folder, tests


def _judge_env(scratch: Path, limits: dict) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(
        PYTHONPATH=str(ROOT),
        PYTHONNOUSERSITE="1",  # nothing a student planted in ~/.local runs in the next judge
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        HOME=str(scratch),
        TMPDIR=str(scratch / "tmp"),
        COURSE_LIMITS=json.dumps(limits),
    )
    return env


def _judge_command(judge: Path, tests: list[str], target: Path, report: Path, stream: Path,
                   basetemp: Path, test_timeout: float, collect_only: bool = False) -> list[str]:
    command = [
        sys.executable, "-m", "pytest", "-c", str(judge / "pytest.ini"), "--rootdir", str(judge),
        "--confcutdir", str(judge), "-p", "no:cacheprovider", "-p", "course_lib.grade",
        "--import-mode=importlib", "--basetemp", str(basetemp), "-o", f"timeout={test_timeout:g}",
        "--target", str(target), "--course-report", str(report), "--grade-stream", str(stream),
        "-q", "--tb=short", "-rN", *tests,
    ]
    if collect_only:
        command.append("--collect-only")
    return command


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


def _namespace_prefix(sandbox: Sandbox, hide: list[Path], work: Path) -> list[str]:
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


def _stop(process: subprocess.Popen, uid: int | None) -> None:
    _kill_session(process)  # the fork server and anything else left in the judge's session
    if uid is not None:
        _kill_user(uid)  # ranks and anything they started, wherever they moved
    _running.pop(process.pid, None)


def _kill_session(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _read_stream(path: Path) -> tuple[list[dict] | None, dict[str, dict]]:
    collected, tests = None, {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None, {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short when the judge was killed
        if "collected" in record:
            collected = record["collected"]
        elif "test" in record and isinstance(record["test"], dict):
            tests[record["test"].get("nodeid")] = record["test"]
    return collected, tests


def classify(returncode: int | None, timed_out: bool, report: dict | None, limit: float) -> tuple[str, str]:
    """The status of one student's grading and a reason: ok, timeout, crashed or grader error."""
    if timed_out:
        return "timeout", f"the time limit per student ({limit:g} s) ran out; the tests not finished count as failed"
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.Signals._value2member_map_ else str(-returncode)
        return "crashed", f"the judge process was killed by {name} (out of memory?); the tests not finished count as failed"
    if returncode in (0, 1):
        if report is None:
            return "grader error", "pytest finished but its report is missing or unreadable"
        return "ok", ""
    meaning = {2: "pytest was interrupted", 3: "pytest hit an internal error", 4: "pytest was called wrongly",
               5: "pytest found no tests"}.get(returncode, f"pytest exited with code {returncode}")
    return "grader error", meaning


@dataclass
class Result:
    student: str
    status: str
    detail: str
    tests: list[dict]
    seconds: float
    source: str = ""

    def earned(self, exercise: str | None = None, hidden: bool | None = None) -> float:
        return sum(t["score"] for t in self.tests if (exercise is None or t["exercise"] == exercise)
                   and (hidden is None or t["hidden"] == hidden))

    def possible(self) -> float:
        return sum(t["max_score"] for t in self.tests)


def _merge(expected: list[dict], results: dict[str, dict], status: str) -> list[dict]:
    """One row per expected graded test; a test the judge did not finish counts as failed, with the reason."""
    rows = []
    for test in expected:
        got = results.get(test["nodeid"])
        row = {"nodeid": test["nodeid"], "exercise": test["exercise"], "hidden": test["hidden"],
               "points": float(test["points"])}
        not_graded = test.get("not_graded") or (got or {}).get("not_graded")
        if not_graded:
            row.update(outcome="not graded", score=0.0, max_score=0.0, message=str(not_graded))
        elif got is None:
            why = {"timeout": "not run: the time limit per student ran out before this test finished",
                   "crashed": "not run: the grading process crashed before this test finished"}.get(status, "not run")
            row.update(outcome="failed", score=0.0, max_score=row["points"], message=why)
        elif got.get("outcome") == "skipped":
            row.update(outcome="not graded", score=0.0, max_score=0.0, message=str(got.get("message") or "skipped"))
        else:
            passed = got.get("outcome") == "passed"
            row.update(outcome="passed" if passed else "failed", score=row["points"] if passed else 0.0,
                       max_score=row["points"], message=str(got.get("message") or ""))
        rows.append(row)
    return rows


@dataclass
class Settings:
    out: Path
    work: Path
    judge: Path
    tests: list[str]
    expected: list[dict]
    sandbox: Sandbox
    timeout: float
    test_timeout: float
    memory_bytes: int
    max_processes: int
    hide: list[Path]


def grade_one(name: str, entry: Path, slot: int, uid: int | None, s: Settings) -> Result:
    """Grade one submission in its own scratch folder, with its own judge process."""
    started = time.monotonic()
    home = s.work / f"s{slot}-{name}"
    home.mkdir(mode=0o711)
    private, scratch = home / "judge", home / "scratch"
    private.mkdir(mode=0o700)
    (scratch / "exercises").mkdir(parents=True)
    (scratch / "tmp").mkdir()
    try:
        files, found_in = collect_exercise_files(entry)
    except (SubmissionError, OSError) as error:
        result = Result(name, "grader error", f"could not read the submission: {error}", [], time.monotonic() - started)
        _write_student(result, s.out / name, None)
        return result
    for file_name, data in files.items():
        (scratch / "exercises" / file_name).write_bytes(data)
    if uid is not None:
        for path in [scratch, scratch / "exercises", scratch / "tmp", *(scratch / "exercises").iterdir()]:
            os.chown(path, uid, uid)
        os.chmod(scratch, 0o700)
    limits = {"memory_bytes": s.memory_bytes, "max_processes": s.max_processes, "file_bytes": 64 * 2**20,
              "cwd": str(scratch)}
    if uid is not None:
        limits.update(uid=uid, gid=uid)
    report, stream, log_path = private / "report.json", private / "stream.jsonl", private / "judge.log"
    command = _judge_command(s.judge, s.tests, scratch / "exercises", report, stream, private / "tmp", s.test_timeout)
    command = _namespace_prefix(s.sandbox, s.hide, s.work) + command
    timed_out = False
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=s.judge, env=_judge_env(scratch, limits), stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _running[process.pid] = (process, uid)
        try:
            process.wait(timeout=s.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _stop(process, uid)
    returncode = None if timed_out else process.returncode
    data = _read_json(report) if not timed_out else None
    if data is not None and not isinstance(data.get("tests"), list):
        data = None
    status, detail = classify(returncode, timed_out, data, s.timeout)
    _, streamed = _read_stream(stream)
    results = {t.get("nodeid"): t for t in data["tests"]} if data is not None else streamed
    if status == "grader error" and not streamed and data is None:
        detail += ": " + _tail(log_path, 1500)
    tests = _merge(s.expected, results, status) if status != "grader error" or results else []
    if not files:
        detail = (detail + "; " if detail else "") + "no exNN_*.py files found in the submission"
    result = Result(name, status, detail, tests, time.monotonic() - started, found_in)
    _write_student(result, s.out / name, log_path)
    shutil.rmtree(home, ignore_errors=True)
    return result


def _write_student(result: Result, folder: Path, log_path: Path | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    log = _tail(log_path, 2**20) if log_path is not None else ""  # the judge's output, for the instructor
    (folder / "grading.log").write_text(log + "\n" if log else f"{result.status}: {result.detail}\n")
    write_results_json(result, folder / "results.json")
    write_feedback(result, folder / "feedback.md")


def _tail(path: Path, size: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - size))
            return handle.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


# ----------------------------------------------------------------------------------------------
# Outputs: Gradescope's results.json, a feedback page, the CSV gradebook.


def _test_name(test: dict, index: dict) -> str:
    if test["hidden"]:
        return f"{test['exercise']}: hidden test {index[test['nodeid']]}"
    return f"{test['exercise']}: {test['nodeid'].split('::', 1)[-1]}"


def _hidden_index(tests: list[dict]) -> dict:
    index, counts = {}, {}
    for t in tests:
        if t["hidden"]:
            counts[t["exercise"]] = counts.get(t["exercise"], 0) + 1
            index[t["nodeid"]] = counts[t["exercise"]]
    return index


def write_results_json(result: Result, path: Path) -> None:
    index = _hidden_index(result.tests)
    tests = []
    for t in result.tests:
        entry = {"name": _test_name(t, index), "score": t["score"], "max_score": t["max_score"],
                 "visibility": "hidden" if t["hidden"] else "visible",
                 "output": t["message"] if not t["hidden"] else ("passed" if t["outcome"] == "passed" else "failed")}
        if t["outcome"] == "not graded":
            entry["output"] = f"not graded: {t['message']}"
        else:
            entry["status"] = t["outcome"]
        tests.append(entry)
    summary = f"Grading status: {result.status}." + (f" {result.detail}" if result.detail else "")
    data = {"score": result.earned(), "output": summary, "visibility": "visible", "stdout_visibility": "hidden",
            "tests": tests}
    path.write_text(json.dumps(data, indent=1))


def write_feedback(result: Result, path: Path) -> None:
    index = _hidden_index(result.tests)
    lines = [f"# Feedback for {result.student}", ""]
    if result.status == "grader error":
        lines += ["Your submission could not be graded automatically; your instructor will look at it.", "",
                  f"Reason: {result.detail}", ""]
    else:
        lines += [f"**{result.earned():g} / {result.possible():g} points** (grading status: {result.status})", ""]
        if result.detail:
            lines += [f"Note: {result.detail}", ""]
        lines += ["| test | result | points |", "|---|---|---|"]
        for t in result.tests:
            points = "–" if t["outcome"] == "not graded" else f"{t['score']:g} / {t['max_score']:g}"
            lines.append(f"| {_test_name(t, index)} | {t['outcome']} | {points} |")
        problems = [t for t in result.tests if t["outcome"] != "passed" and not t["hidden"]]
        if problems:
            lines += ["", "## What went wrong", ""]
            for t in problems:
                message = t["message"].strip() or t["outcome"]
                if len(message) > 2000:
                    message = message[:2000] + "\n…"
                lines += [f"### {_test_name(t, index)}", "", "```", message.replace("```", "'''"), "```", ""]
        if any(t["hidden"] for t in result.tests):
            lines += ["", "Hidden tests show only whether they passed."]
    path.write_text("\n".join(lines) + "\n")


def _exercise_columns(expected: list[dict]) -> list[tuple[str, str, bool]]:
    columns = []
    for exercise in sorted({t["exercise"] for t in expected}):
        columns.append((exercise, exercise, False))
        if any(t["hidden"] and t["exercise"] == exercise for t in expected):
            columns.append((f"{exercise} hidden", exercise, True))
    return columns


def write_gradebook(results: list[Result], expected: list[dict], path: Path) -> None:
    columns = _exercise_columns(expected)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "status", *(c[0] for c in columns), "total", "possible", "not graded",
                         "seconds", "detail"])
        for r in sorted(results, key=lambda r: r.student.lower()):
            if r.status == "grader error" and not r.tests:
                cells, total, possible = [""] * len(columns), "", ""
            else:
                cells = [f"{r.earned(ex, hidden):g}" for _, ex, hidden in columns]
                total, possible = f"{r.earned():g}", f"{r.possible():g}"
            not_graded = sum(1 for t in r.tests if t["outcome"] == "not graded")
            writer.writerow([r.student, r.status, *cells, total, possible, not_graded, f"{r.seconds:.1f}",
                             r.detail.replace("\n", " ")[:500]])


# ----------------------------------------------------------------------------------------------
# The class.


def _collect_expected(s: Settings, judge_tests: list[str]) -> list[dict]:
    """Collect the tests once, against an empty folder: every student is graded on this list."""
    folder = s.work / "collect"
    (folder / "target").mkdir(parents=True)
    (folder / "tmp").mkdir()
    command = _judge_command(s.judge, judge_tests, folder / "target", folder / "report.json",
                             folder / "stream.jsonl", folder / "basetemp", s.test_timeout, collect_only=True)
    done = subprocess.run(command, cwd=s.judge, env=_judge_env(folder, {}), capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    collected, _ = _read_stream(folder / "stream.jsonl")
    if done.returncode != 0 or collected is None:
        raise SystemExit(f"error: the course's tests could not be collected (pytest exit code {done.returncode}):\n"
                         f"{(done.stdout + done.stderr)[-3000:]}")
    expected = []
    for test in collected:
        if test.get("points") is None:
            continue  # not a graded test
        expected.append({**test, "exercise": _exercise_of(test["nodeid"]), "hidden": _is_hidden(test["nodeid"])})
    return expected


def default_memory_gb() -> float:
    """6 GiB of address space per student process (importing torch takes 3.3), or none where CUDA is present."""
    return 0.0 if os.path.exists("/dev/nvidiactl") else 6.0


def grade_class(submissions: Path, out: Path, jobs: int = 1, timeout: float = 900.0, test_timeout: float = 120.0,
                hidden: Path | None = None, exercises: list[str] | None = None, memory_gb: float | None = None,
                max_processes: int = 256, progress: bool = True) -> list[Result]:
    """Grade every submission in `submissions`; write the gradebook and feedback to `out`; return the results."""
    submissions, out = submissions.resolve(), out.resolve()
    entries = [(name, path) for name, path in find_submissions(submissions) if path.resolve() != out]
    sandbox = detect_sandbox()
    if memory_gb is None:
        memory_gb = default_memory_gb()
    if not memory_gb:
        sandbox.missing.append("no memory limit for student code (--memory-gb 0; on a CUDA machine that is the "
                               "default, because CUDA reserves more address space than any useful limit)")
    print(sandbox.describe(), file=sys.stderr, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="course-grade-"))
    os.chmod(work, 0o711)
    try:
        judge, judge_tests = build_judge(work, hidden.resolve() if hidden else None, exercises)
        if not judge_tests:
            raise SystemExit("error: no graded test files to run" + (f" for {', '.join(exercises)}" if exercises else ""))
        s = Settings(out=out, work=work, judge=judge, tests=judge_tests, expected=[], sandbox=sandbox,
                     timeout=timeout, test_timeout=test_timeout, memory_bytes=int(memory_gb * 2**30),
                     max_processes=max_processes,
                     hide=[ROOT / "solutions", submissions, out, *([hidden.resolve()] if hidden else [])])
        s.expected = _collect_expected(s, judge_tests)
        possible = sum(t["points"] for t in s.expected if not t.get("not_graded"))
        print(f"grading {len(entries)} submissions from {submissions}: {len(s.expected)} graded tests, "
              f"{possible:g} points possible, {jobs} at a time, at most {timeout:g} s each", file=sys.stderr, flush=True)
        uids: queue.Queue = queue.Queue()
        for uid in (_free_uids(jobs) if sandbox.users else [None] * jobs):
            uids.put(uid)

        def task(index: int, name: str, entry: Path) -> Result:
            uid = uids.get()
            try:
                return grade_one(name, entry, index, uid, s)
            except Exception as error:  # noqa: BLE001 - a bug here must cost one row, never the class
                return Result(name, "grader error", f"{type(error).__name__}: {error}", [], 0.0)
            finally:
                uids.put(uid)

        results: list[Result] = []
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(entries), unit="student", file=sys.stderr, dynamic_ncols=True)
        pool, futures = ThreadPoolExecutor(max_workers=max(1, jobs)), []
        try:
            futures = [pool.submit(task, i, name, entry) for i, (name, entry) in enumerate(entries)]
            for future in as_completed(futures):
                result = future.result()
                results.append(result)
                if bar is not None:
                    bar.set_postfix_str(f"{result.student}: {result.status}", refresh=False)
                    bar.update(1)
        except BaseException:  # Ctrl-C: stop every judge now rather than at its time limit
            for future in futures:
                future.cancel()
            for process, uid in list(_running.values()):
                _stop(process, uid)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar.close()
        write_gradebook(results, s.expected, out / "grades.csv")
        return sorted(results, key=lambda r: r.student.lower())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.grade", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submissions", type=Path, help="folder with one folder or .zip per student")
    parser.add_argument("--out", type=Path, required=True, help="where grades.csv and each student's results go")
    parser.add_argument("--jobs", type=int, default=1, help="students graded at once (default 1)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for one student's whole run (default 900)")
    parser.add_argument("--test-timeout", type=float, default=120.0, help="seconds for one test (default 120)")
    parser.add_argument("--tests", type=Path, default=None, help="folder of hidden tests (test_exNN_*.py), graded as hidden")
    parser.add_argument("--exercises", default=None, help="grade only these, e.g. ex00,ex01 (default: all)")
    parser.add_argument("--memory-gb", type=float, default=None,
                        help="address-space limit of each student process in GiB; 0 for none (default 6, "
                             "none on a CUDA machine; importing torch alone takes 3.3)")
    parser.add_argument("--max-processes", type=int, default=256,
                        help="processes and threads a student's user may have at once (default 256; needs root)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    options = parser.parse_args(argv)
    if not options.submissions.is_dir():
        parser.error(f"{options.submissions} is not a folder")
    if options.tests is not None and not options.tests.is_dir():
        parser.error(f"--tests {options.tests} is not a folder")
    if options.jobs < 1 or options.timeout <= 0 or options.test_timeout <= 0:
        parser.error("--jobs, --timeout and --test-timeout must be positive")
    exercises = [e.strip() for e in options.exercises.split(",") if e.strip()] if options.exercises else None
    def interrupted(signum, frame):
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)  # like Ctrl-C: the running judges are stopped, not left behind
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started in the background by a shell
        signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    try:
        results = grade_class(options.submissions, options.out, options.jobs, options.timeout, options.test_timeout,
                              options.tests, exercises, options.memory_gb, options.max_processes,
                              progress=not options.no_progress)
    except KeyboardInterrupt:
        print("interrupted: every running judge was stopped; grades.csv was not written", file=sys.stderr)
        return 130
    counts = {status: sum(r.status == status for r in results) for status in STATUSES}
    print(f"graded {len(results)} students in {time.monotonic() - started:.1f} s: "
          + ", ".join(f"{n} {status}" for status, n in counts.items() if n)
          + f"\ngradebook: {options.out / 'grades.csv'}")
    for r in results:
        if r.status != "ok":
            print(f"  {r.student}: {r.status}: {r.detail.splitlines()[0] if r.detail else ''}")
    return 1 if counts["grader error"] else 0


if __name__ == "__main__":
    sys.exit(main())
