"""Building Gradescope's autograder package: what goes in the zip, and its time limits calibrated here (the
instructor's tool; `python3 course.py grade gradescope`, whose command is in command.py).

`build` calibrates each graded test's time limit from the reference solutions on this machine, once, and writes
the zip (`_write_zip`): setup.sh and run_autograder at its root (Gradescope's "Autograder Specifications"), the
course library, the graded tests of the chosen exercises, the hidden tests, settings/gradescope.json (CONFIG),
and the course's pinned requirements, only those that grading imports (`pinned_requirements`). The reference
solutions are never in it. What runs inside Gradescope's container is in container.py.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shutil
import stat
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from course_lib.grading import time_rule
from course_lib.grading.results import exercise_of
from course_lib.paths import EXERCISES, ROOT, SOLUTIONS, TESTS

CONFIG = "settings/gradescope.json"  # in a folder: a mount namespace hides folders, and this one names hidden tests
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
VENV = "/opt/course-venv"  # where setup.sh puts the course's Python packages on Gradescope


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
# It grades /autograder/submission and writes /autograder/results/results.json (see gradescope/ in the course's grader).
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
