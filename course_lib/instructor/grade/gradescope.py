"""Gradescope's autograder, built from the course's own grader (the instructor's tool).

    python3 course.py grade gradescope --out autograder.zip [--tests HIDDEN_TESTS] [--exercises ex00,ex05]
                                       [--timeout 540] [--memory-gb 4] [--time-factor 4] ...

Builds the zip Gradescope asks for (its "Autograder Specifications": setup.sh and run_autograder at the root,
the rest unpacked to /autograder/source). Inside: the course library, the graded tests of the chosen exercises,
the hidden tests, each test's time limit (calibrated here, now, from the reference solutions, and never again),
the course's pinned requirements (only those grading imports: no JupyterLab, widgets or plots), and
settings/gradescope.json, which says what was built. The reference solutions are not in it: no graded test reads
them. Beside the zip, autograder.time_limits.json (named after --out) holds each test's limit as a table: its
reference time, its limit and how the rule gave it.

On Gradescope, setup.sh runs once when the image is built (apt: Python, bubblewrap; pip: the course's pins, CPU
torch); run_autograder runs once per submission and calls `run` below, which grades /autograder/submission with
the same judge, sandbox and limits as `python3 course.py grade`, and writes /autograder/results/results.json:

* what was submitted: the exercises/ folder's files, the whole course folder, or a zip of either;
* a missing file, a file named differently (ex05_ddp (1).py) or one that does not compile is said at the top of
  results.json's output, and costs the tests of that exercise only;
* hidden tests carry visibility "after_published"; tests that need a GPU show as not graded, with the reason;
* whatever happens, a results.json is written (run_autograder writes one itself if Python cannot start).

AUTOGRADER_ROOT replaces /autograder (for the course's own test of the package, which cannot use /autograder).
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import itertools
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from course_lib import stopping
from course_lib.grading import time_rule
from course_lib.grading.results import exercise_of
from course_lib.paths import EXERCISES, ROOT, SOLUTIONS, TESTS

CONFIG = "settings/gradescope.json"  # in a folder: a mount namespace hides folders, and this one names hidden tests
HIDDEN_VISIBILITY = "after_published"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
VENV = "/opt/course-venv"  # where setup.sh puts the course's Python packages on Gradescope
EXERCISE_NAME = re.compile(r"^ex\d\d_\w+\.py$")
MAX_LISTED = 2000  # names looked at in one submission, to say what a misnamed file should be called


# ---------------------------------------------------------------------------------------------- the package


# pyproject.toml's dependencies that grading never imports, left out of the autograder's requirements.txt: the
# graded tests, course_lib.grading and the grader import none of them (tests/course/instructor/test_gradescope.py
# imports them all with these packages hidden). numpy, which graded tests import, comes with torchvision.
NOT_FOR_GRADING = {
    "jupyterlab": "the lessons' JupyterLab",
    "ipywidgets": "the lessons' sliders and explorers",
    "matplotlib": "the lessons' plots and diagrams",
    "nbclient": "runs the lessons (the course's own tests)",
    "nbformat": "reads the lessons (the course's own tests)",
    "ipykernel": "the lessons' Python kernel",
    "pytest-xdist": "the course's own suite on several workers; the judge runs one pytest per submission",
    "tqdm": "the class grader's progress bar, which Gradescope's run turns off",
}


# What setup.sh imports once installed: requirements.txt's packages, and numpy that torchvision brings.
GRADING_IMPORTS = "torch, torchvision, numpy, pytest, pytest_timeout, hypothesis, cloudpickle"


def requirement_name(requirement: str) -> str:
    """'pytest-timeout>=2.3' -> 'pytest-timeout' (lower case, '_' and '.' as '-', as pip compares them)."""
    return re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)).lower()


def pyproject_dependencies() -> list[str]:
    """pyproject.toml's [project] dependencies, read without tomllib (Python 3.10 has none)."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    return re.findall(r'^\s*"([^"]+)",?\s*(?:#.*)?$', block, re.M)


def pinned_requirements() -> tuple[list[str], list[str]]:
    """(requirements.txt: pyproject.toml's dependencies less NOT_FOR_GRADING, constraints.txt's pins): what setup.sh
    installs, exactly."""
    dependencies = pyproject_dependencies()
    unknown = set(NOT_FOR_GRADING) - {requirement_name(d) for d in dependencies}
    if unknown:  # a package renamed or dropped in pyproject.toml: say so rather than install what was meant to go
        raise RuntimeError(f"NOT_FOR_GRADING names {sorted(unknown)}, which pyproject.toml's dependencies lack")
    requirements = [d for d in dependencies if requirement_name(d) not in NOT_FOR_GRADING]
    pins = [line.strip() for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    return requirements, pins


def setup_script(pins: list[str]) -> str:
    """setup.sh: Python, bubblewrap, and the course's packages in a venv; torch from PyTorch's CPU index."""
    cpu_wheels = " ".join(f"'{pin}'" for pin in pins)
    return f"""#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (an Ubuntu image).
# Python and bubblewrap (the students' sandbox) from apt; the course's packages, at the versions the course pins,
# into {VENV}; torch and torchvision from PyTorch's CPU index (Gradescope's machines have no GPU).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends python3 python3-venv python3-pip bubblewrap ca-certificates
python3 -m venv {VENV}
{VENV}/bin/python -m pip install --upgrade pip
{VENV}/bin/python -m pip install --index-url {TORCH_CPU_INDEX} {cpu_wheels}
{VENV}/bin/python -m pip install -r /autograder/source/requirements.txt -c /autograder/source/constraints.txt
{VENV}/bin/python -c "import {GRADING_IMPORTS}; print('ready: torch', torch.__version__)"
"""


RUN_AUTOGRADER = f"""#!/usr/bin/env bash
# Gradescope runs this for each submission (copied to /autograder/run_autograder; working folder /autograder).
# It grades /autograder/submission and writes /autograder/results/results.json (see gradescope.py in the course).
root="${{AUTOGRADER_ROOT:-/autograder}}"
python="${{COURSE_PYTHON:-{VENV}/bin/python}}"
cd "$root/source" || exit 1
# In the background, so that a signal to this script (SIGTERM, Ctrl-C) reaches the grader at once, which stops the
# judge and every process of the student's before it writes results.json (bash alone would wait for it to finish).
"$python" -m course_lib.instructor.grade.gradescope run --root "$root" &
grader=$!
trap 'kill -TERM "$grader" 2>/dev/null' TERM INT HUP
wait "$grader"
code=$?
while kill -0 "$grader" 2>/dev/null; do  # wait ended for a signal: wait for the grader itself
  wait "$grader"
  code=$?
done
if [ ! -s "$root/results/results.json" ]; then
  # Python itself failed before writing anything: a results.json all the same, never a crashed autograder.
  mkdir -p "$root/results"
  printf '{{"score": 0, "output": "The autograder could not grade this submission (exit code %s). Your instructor can see why in the autograder output.", "tests": []}}\\n' "$code" > "$root/results/results.json"
fi
exit 0
"""


@dataclass
class BuildOptions:
    """How the package grades (see main's --help for each)."""

    hidden: Path | None = None
    exercises: list[str] | None = None
    timeout: float = 540.0  # one submission's whole run: under Gradescope's default limit of 10 minutes
    test_timeout: float = time_rule.CEILING
    memory_gb: float = 4.0
    time_factor: float = time_rule.FACTOR
    time_floor: float = time_rule.FLOOR
    cpus: float = 2.0  # the CPUs the instructor gives Gradescope's container (its default is half of one)
    use_cache: bool = True


def build(out: Path, o: BuildOptions) -> dict:
    """Calibrate the time limits here, then write the zip at `out`; return gradescope.json's contents."""
    from course_lib.instructor.grade.classroom import GradeOptions, prepare_settings
    from course_lib.instructor.grade.sandbox import detect_isolation
    from course_lib.instructor.grade.time_limits import calibrate
    from course_lib.instructor.grade.users import UidClaim

    if not SOLUTIONS.is_dir():
        raise SystemExit("error: the package's time limits are calibrated from the reference solutions, and "
                         f"{SOLUTIONS} is missing: build it from the instructor's copy of the course")
    exercises = o.exercises or sorted({exercise_of(p.name) for p in TESTS.glob("test_ex*.py")})
    unknown = [e for e in exercises if not list(TESTS.glob(f"test_{e}_*.py"))]
    if unknown:
        raise SystemExit(f"error: no graded tests for {', '.join(unknown)} (the exercises are "
                         f"{', '.join(sorted({exercise_of(p.name) for p in TESTS.glob('test_ex*.py')}))})")
    work = Path(tempfile.mkdtemp(prefix="course-gradescope-build-"))
    os.chmod(work, 0o711)
    claim = None
    try:
        isolation = detect_isolation("auto")
        options = GradeOptions(jobs=1, test_timeout=o.test_timeout, hidden=o.hidden.resolve() if o.hidden else None,
                               exercises=exercises, memory_gb=o.memory_gb, progress=False)
        s = prepare_settings(work / "out", work, work / "no-submissions", options, isolation)
        claim = UidClaim(1) if s.isolation.users else None
        # The graded tests run up to 3 ranks at once: on fewer CPUs than that they take turns, so the limits grow
        # by how much fewer Gradescope's container has than the ranks had here.
        slower = max(1.0, min(usable_cores(), 3) / o.cpus)
        limits = calibrate(s, claim.uids[0] if claim else None, o.time_factor * slower, o.time_floor, 1, o.use_cache)
        table = limits_table_path(out)  # the instructor's copy; the package carries the limits in CONFIG
        out.parent.mkdir(parents=True, exist_ok=True)
        limits.write(table)
        print(limits.summary(table), file=sys.stderr, flush=True)
        config = {
            "exercises": exercises,
            "exercise_files": sorted(p.name for e in exercises for p in EXERCISES.glob(f"{e}_*.py")),
            "time_limits": limits.limits,
            "time_limits_after_a_loop": limits.after_a_loop,
            "limit_note": limits.note() + " (the reference solution's times were measured on the instructor's "
                                          "machine when the autograder was built)",
            # The Hypothesis profile the limits were measured with: the same number of examples when grading.
            "gradescope_cpus": o.cpus,
            "hypothesis_profile": os.environ.get("COURSE_HYPOTHESIS", ""),
            "timeout": o.timeout, "test_timeout": o.test_timeout, "memory_gb": o.memory_gb,
            "hidden_tests": sorted(p.relative_to(o.hidden).as_posix() for p in o.hidden.rglob("test_*.py"))
            if o.hidden else [],
            "graded_tests": [t.nodeid for t in s.judge.expected],
            "points_possible_here": sum(t.possible for t in s.judge.expected),
            "built": {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
                      "torch": _torch_version(), "isolation": s.isolation.mode,
                      "cores": usable_cores(), "reference_seconds": round(limits.reference_seconds, 1),
                      "reference_memory_peak_gib": round(limits.reference_memory_peak_bytes / 2**30, 2)},
        }
        _write_zip(out, config, exercises, o.hidden)
        return config
    finally:
        if claim is not None:
            claim.release()
        shutil.rmtree(work, ignore_errors=True)


def limits_table_path(out: Path) -> Path:
    """Where build writes each test's time limit as a table: beside the zip (autograder.time_limits.json)."""
    return out.with_name(f"{out.stem}.time_limits.json")


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _torch_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "?"


def _write_zip(out: Path, config: dict, exercises: list[str], hidden: Path | None) -> None:
    requirements, pins = pinned_requirements()
    entries: dict[str, tuple[bytes, int]] = {
        "setup.sh": (setup_script(pins).encode(), 0o755),
        "run_autograder": (RUN_AUTOGRADER.encode(), 0o755),
        CONFIG: ((json.dumps(config, indent=1) + "\n").encode(), 0o644),
        "requirements.txt": (("\n".join(requirements) + "\n").encode(), 0o644),
        "constraints.txt": ((ROOT / "constraints.txt").read_bytes(), 0o644),
    }

    def add_tree(folder: Path, prefix: str, keep=lambda path: True) -> None:
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            if path.is_file() and not path.is_symlink() and "__pycache__" not in relative.parts and keep(relative):
                entries[f"{prefix}/{relative.as_posix()}"] = (path.read_bytes(), 0o644)

    add_tree(ROOT / "course_lib", "course_lib")
    for name in ("conftest.py", "reference_times.json"):
        if (TESTS / name).is_file():
            entries[f"tests/{name}"] = ((TESTS / name).read_bytes(), 0o644)
    for exercise in exercises:
        for path in sorted(TESTS.glob(f"test_{exercise}_*.py")):
            entries[f"tests/{path.name}"] = (path.read_bytes(), 0o644)
    if hidden is not None:
        add_tree(hidden, "tests/hidden", keep=lambda relative: not relative.name.startswith("."))
    leaked = [name for name in entries if name.startswith("solutions/") or "/solutions/" in name]
    if leaked:  # never: the loop above takes nothing from solutions/
        raise RuntimeError(f"the package would hold the solutions: {leaked[:3]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".part")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, (data, mode) in entries.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    partial.replace(out)


# ------------------------------------------------------------------------------------------ the submission


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


# ------------------------------------------------------------------------------------------------ grading


def close_to_students(source: Path, results: Path) -> None:
    """Where no sandbox can be made, file permissions are what is left: the tests (hidden ones included), the
    package's settings and the results folder are the grader's alone (student code runs as another user)."""
    for folder in (source / "tests", (source / CONFIG).parent):
        for path in [folder, *folder.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o700 if path.is_dir() else 0o600)
    results.mkdir(parents=True, exist_ok=True)
    results.chmod(0o755)


def run(root: Path) -> int:
    """Grade root/submission with the package in root/source; write root/results/results.json. Never raises."""
    started = time.monotonic()
    results = root / "results" / "results.json"
    try:
        results.parent.mkdir(parents=True, exist_ok=True)
        results.unlink(missing_ok=True)
        data = _grade(root, started)
    except BaseException as error:  # noqa: BLE001 - whatever happens, Gradescope gets a results.json
        traceback.print_exc()
        why = ("it was stopped before it finished (SIGTERM or Ctrl-C), not by your code"
               if isinstance(error, KeyboardInterrupt) else
               f"an error in the grader, not in your code ({type(error).__name__})")
        data = {"score": 0.0, "execution_time": round(time.monotonic() - started),
                "output": f"The autograder could not grade this submission: {why}. Your instructor can see the "
                          "details in its output.",
                "visibility": "visible", "stdout_visibility": "hidden", "tests": []}
    partial = results.with_name("results.json.part")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    partial.replace(results)  # whole or not at all: student code can neither read nor write this folder
    print(f"results.json: {data['score']:g} points; {len(data.get('tests', []))} tests; "
          f"{time.monotonic() - started:.1f} s", flush=True)
    return 0


def _grade(root: Path, started: float) -> dict:
    from course_lib.instructor.grade.classroom import GradeOptions, prepare_settings
    from course_lib.instructor.grade.report import results_json
    from course_lib.instructor.grade.sandbox import detect_isolation
    from course_lib.instructor.grade.student import grade_files
    from course_lib.instructor.grade.users import UidClaim

    source, results = root / "source", root / "results"
    config = json.loads((source / CONFIG).read_text())
    submission = read_submission(root / "submission", config["exercise_files"])
    for line in submission.problems:
        print(f"submission: {line}", flush=True)
    if config.get("hypothesis_profile"):
        os.environ["COURSE_HYPOTHESIS"] = config["hypothesis_profile"]
    # weak isolation is graded all the same: the container holds no solutions (COURSE_GRADE_ISOLATION forces one)
    isolation = detect_isolation(os.environ.get("COURSE_GRADE_ISOLATION", "auto"))
    if isolation.mode != "bwrap":
        close_to_students(source, results)
    hidden = source / "tests" / "hidden"
    work = Path(tempfile.mkdtemp(prefix="course-gradescope-"))
    os.chmod(work, 0o711)
    claim = None
    try:
        options = GradeOptions(jobs=1, timeout=config["timeout"], test_timeout=config["test_timeout"],
                               hidden=hidden if hidden.is_dir() else None, exercises=config["exercises"],
                               memory_gb=config["memory_gb"], progress=False)
        s = prepare_settings(work / "out", work, root / "submission", options, isolation)
        s.hide = [p for p in [*s.hide, results, source / "tests", (source / CONFIG).parent] if p.exists()]
        s.time_limits = work / "time-limits.json"
        s.time_limits.write_text(json.dumps({**config["time_limits"],
                                             time_rule.AFTER_A_LOOP: config.get("time_limits_after_a_loop", {})}))
        os.chmod(s.time_limits, 0o644)
        s.limit_note = config["limit_note"]
        claim = UidClaim(1) if s.isolation.users else None
        result = grade_files("submission", submission.files, submission.found_in, 1, claim.uids[0] if claim else None,
                             s)
        log = (work / "out" / "submission" / "grading.log")
        if log.exists():  # the judge's own output: Gradescope shows stdout to the instructor only
            print(log.read_text(errors="replace")[-20000:], flush=True)
        return results_json(result, hidden_visibility=HIDDEN_VISIBILITY, preamble=submission.problems,
                            epilogue=student_summary(result), execution_time=time.monotonic() - started)
    finally:
        if claim is not None:
            claim.release()
        shutil.rmtree(work, ignore_errors=True)


def student_summary(result) -> list[str]:
    """What the top of results.json tells the student besides the status: points per exercise on the visible tests
    (not the hidden ones: with visibility after_published, Gradescope hides the total until the grades are
    published), whether hidden tests exist, the functions still untouched stubs, and the tests that need a GPU."""
    from course_lib.grading.results import stub_groups
    from course_lib.tables import plural

    visible = [t for t in result.tests if not t.hidden]
    exercises = sorted({t.exercise for t in visible})
    points = [(e, sum(t.earned for t in visible if t.exercise == e), sum(t.possible for t in visible if t.exercise == e))
              for e in exercises]
    lines = ["Visible tests: " + ", ".join(f"{e} {got:g} / {possible:g} points" for e, got, possible in points) + "."
             ] if points else []
    hidden = [t for t in result.tests if t.hidden]
    if hidden:
        lines.append(f"Hidden tests: {plural(len(hidden), 'test')}, whose results appear when your instructor "
                     "publishes the grades.")
    groups = stub_groups(visible)
    if groups:  # the functions still to write, each once, where the tests' outputs say it test by test
        lines.append("Not implemented yet (every test that reaches one fails at once; its output gives the hint): "
                     + "; ".join(f"{g.stub.name} ({g.counts()})" for g in groups) + ".")
    needs_gpu = [t for t in visible if t.status == "not graded"]
    if needs_gpu:
        lines.append(f"Not graded here: {plural(len(needs_gpu), 'test')} needing a GPU, which Gradescope's machines "
                     "lack; they count in neither your points nor the points possible.")
    return lines


# ---------------------------------------------------------------------------------------------- the command


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # SIGTERM (run_autograder passes its signals on as SIGTERM) stops the judge and the student's processes, as
    # Ctrl-C does; Ctrl-C works although run_autograder starts this in the background, where SIGINT is ignored.
    stopping.stop_like_ctrl_c()
    if argv[:1] == ["run"]:
        parser = argparse.ArgumentParser(prog="run_autograder", description="grade one Gradescope submission")
        parser.add_argument("run")
        parser.add_argument("--root", type=Path, default=Path(os.environ.get("AUTOGRADER_ROOT", "/autograder")))
        return run(parser.parse_args(argv).root.resolve())
    parser = argparse.ArgumentParser(prog="python3 course.py grade gradescope", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the zip to write (e.g. autograder.zip)")
    parser.add_argument("--tests", type=Path, default=None, help="folder of hidden tests (test_exNN_*.py), shown "
                        f"to students with visibility {HIDDEN_VISIBILITY!r}")
    parser.add_argument("--exercises", default=None, help="only these, e.g. ex00,ex05 (default: every exercise)")
    parser.add_argument("--timeout", type=float, default=540.0, help="seconds for one submission's whole run "
                        "(default 540: under Gradescope's default limit of 10 minutes, so results.json is written)")
    parser.add_argument("--test-timeout", type=float, default=time_rule.CEILING,
                        help=f"the most a calibrated limit may be (default {time_rule.CEILING:g})")
    parser.add_argument("--memory-gb", type=float, default=4.0, help="memory of all of a submission's processes "
                        "(default 4; give Gradescope's container more than this)")
    parser.add_argument("--time-factor", type=float, default=time_rule.FACTOR,
                        help=f"a test's limit is this many times the reference's time here (default {time_rule.FACTOR:g};"
                             " raise it if Gradescope's machine is much slower than this one)")
    parser.add_argument("--time-floor", type=float, default=time_rule.FLOOR,
                        help=f"... and at least this many seconds (default {time_rule.FLOOR:g})")
    parser.add_argument("--cpus", type=float, default=2.0, help="the CPUs you give Gradescope's container in its "
                        "Autograder Settings (default 2; Gradescope's own default is 0.5): with fewer than 3, the "
                        "limits grow, as the tests' ranks take turns")
    parser.add_argument("--recalibrate", action="store_true", help="grade the reference again, not from the cache")
    options = parser.parse_args(argv)
    if options.tests is not None and not options.tests.is_dir():
        parser.error(f"--tests {options.tests} is not a folder")
    if options.out.suffix != ".zip":
        parser.error(f"--out {options.out}: Gradescope takes a .zip file")
    if min(options.timeout, options.test_timeout, options.memory_gb, options.time_factor, options.cpus) <= 0:
        parser.error("--timeout, --test-timeout, --memory-gb, --time-factor and --cpus must be positive")
    exercises = [e.strip() for e in options.exercises.split(",") if e.strip()] if options.exercises else None
    config = build(options.out, BuildOptions(
        hidden=options.tests, exercises=exercises, timeout=options.timeout, test_timeout=options.test_timeout,
        memory_gb=options.memory_gb, time_factor=options.time_factor, time_floor=options.time_floor,
        cpus=options.cpus, use_cache=not options.recalibrate))
    graded = config["graded_tests"]
    peak = config["built"]["reference_memory_peak_gib"]
    peak = f"the reference solutions peaked at {peak:g} GiB here" if peak else "no memory cgroup here to measure it"
    print(f"wrote {options.out}: {', '.join(config['exercises'])}; {len(graded)} graded tests "
          f"({sum('/hidden/' in t for t in graded)} hidden), {config['points_possible_here']:g} points possible on "
          f"this machine; time limits calibrated here in {config['built']['reference_seconds']:g} s.\n"
          f"On Gradescope (the assignment's Configure Autograder page): upload it; in Autograder Settings give the "
          f"container {options.cpus:g} CPUs and at least {max(2.0, options.memory_gb):g} GB of memory ({peak}; "
          "Gradescope's default is 768 MB), and a timeout above --timeout.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
