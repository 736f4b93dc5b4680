"""The Gradescope package: built once, unpacked into a root laid out like Gradescope's, and run on six submissions.

Gradescope unpacks the zip into /autograder/source, puts the student's files in /autograder/submission and reads
/autograder/results/results.json. /autograder cannot be used here, so each submission gets a temporary root with
source/, submission/ and results/, and run_autograder is pointed at it with AUTOGRADER_ROOT (and at this Python
with COURSE_PYTHON, where Gradescope has the venv setup.sh makes). The package grades ex00 and ex05 (DDP: the
distributed exercise) with one hidden test and one hidden GPU-only test. Every results.json is checked against
Gradescope's schema (below, written from Gradescope's "Autograder Specifications" page) and against which tests
each submission must pass, known from how it was written, not from the grader.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.grading import time_rule
from course_lib.grading.results import TestOutcome, read_report
from course_lib.instructor.exercises import make_stub
from course_lib.instructor.grade.gradescope import TORCH_CPU_INDEX, VENV, close_to_students, pinned_requirements
from course_lib.instructor.grade.mount_namespace import unshare_prefix
from course_lib.paths import ROOT

from class_builder import HIDDEN_TEST, sources
from grade_helpers import (BWRAP_PROBLEM, GRADER_ENV, HANG_GUARD, JUDGE_START, PYTHON, needs_root_linux,
                           needs_solutions)

# Gradescope's results.json, from its Autograder Specifications (gradescope-autograders.readthedocs.io, "Output
# format" and "Controlling Test Case Visibility"), and "status" from its gradescope-utils JSONTestRunner.
# The module fixture builds the package (a calibration) and runs it on six submissions: minutes, more on a busy
# machine. Each step has the limit the grader itself sets (above); pytest-timeout's, on the test that sets it up,
# only catches a hang (on a loaded machine the fixture overran a fixed 600 s).
pytestmark = pytest.mark.timeout(HANG_GUARD)

VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
RESULTS_SCHEMA = {
    "type": "object",
    "properties": {
        "score": {"type": "number"},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "visibility": VISIBILITY,
        "stdout_visibility": VISIBILITY,
        "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "score": {"type": "number"},
                "max_score": {"type": "number"},
                "status": {"enum": ["passed", "failed"]},
                "name": {"type": "string"},
                "number": {"type": "string"},
                "output": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "visibility": VISIBILITY,
                "extra_data": {"type": "object"},
            },
            "additionalProperties": False,
        }},
        "leaderboard": {"type": "array"},
    },
    "required": ["score", "tests"],  # the spec needs a score at the top or on every test; the package gives both
    "additionalProperties": False,
}

GPU_HIDDEN_TEST = '''
import pytest


@pytest.mark.gpu(1)
@pytest.mark.points(1)
def test_needs_a_gpu():
    assert False, "never runs on a machine without a GPU"
'''

CHEATER = '''
import glob, json, os

ROOT = {root!r}


def _try_everything():
    """Read the hidden tests and the package's settings; forge results.json; report what worked."""
    seen = []
    for pattern in (ROOT + "/source/tests/hidden/*.py", ROOT + "/source/tests/*.py",
                    ROOT + "/source/settings/*"):
        for path in glob.glob(pattern):
            try:
                seen.append(open(path).read()[:200])
            except OSError:
                pass
    for path in (ROOT + "/results/results.json", ROOT + "/results/forged.json"):
        try:
            with open(path, "w") as handle:
                json.dump({{"score": 1000, "tests": []}}, handle)
            seen.append("wrote " + path)
        except OSError:
            pass
    raise RuntimeError("cheater saw: " + repr(seen))


def shard_range(num_items, world_size, rank):
    _try_everything()


def all_reduce_mean(tensor):
    _try_everything()
'''

FORGED_CONFTEST = '''
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
'''

EX00_SHARD_RANGE = {"ex00: test_shard_range_matches_tensor_split", "ex00: test_shard_range_rejects_bad_input",
                    "ex00: hidden test 1"}


def _solution(name: str) -> str:
    return (ROOT / "solutions" / name).read_text()


def _unpack(archive: Path, target: Path) -> None:
    """Like unzip: files with the modes the zip gives them (zipfile's extractall drops them)."""
    with zipfile.ZipFile(archive) as package:
        for info in package.infolist():
            path = target / info.filename
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(package.read(info))
            path.chmod(stat.S_IMODE(info.external_attr >> 16) or 0o644)


def _submissions(root: Path) -> dict[str, dict[str, bytes | str]]:
    """Submission name -> {path inside submission/: contents}. The cheats aim at root/<their name>/."""
    ex00 = sources({"victim": root / "victim", "submissions": root, "out": root, "hidden": root})
    ex05 = _solution("ex05_ddp.py")
    course_zip = root / "course.zip"
    with zipfile.ZipFile(course_zip, "w") as archive:  # the whole course folder, zipped
        archive.writestr("multigpu-course-main/exercises/ex00_warmup.py", ex00["correct"])
        archive.writestr("multigpu-course-main/exercises/ex05_ddp.py", ex05)
        archive.writestr("multigpu-course-main/solutions/ex05_ddp.py", make_stub(ex05, "ex05_ddp"))  # never taken
        archive.writestr("multigpu-course-main/README.md", "my course\n")
    broken = ex05.replace("def sampler_indices(", "def sampler_indices((", 1)
    return {
        "correct": {"course.zip": course_zip.read_bytes()},
        "partial": {"ex00_warmup.py": ex00["partial"], "ex05_ddp.py": make_stub(ex05, "ex05_ddp")},
        "empty": {},
        "syntax_error": {"ex00_warmup.py": ex00["correct"], "ex05_ddp.py": broken},
        **{name: {"ex00_warmup.py": CHEATER.format(root=str(root / name)), "ex05_ddp (1).py": ex05,
                  "conftest.py": FORGED_CONFTEST, "pytest.ini": "[pytest]\naddopts = --co\n"}
           for name in ("cheating", "cheating_in_the_fallback")},
    }


def _collected(hidden: Path) -> list[TestOutcome]:
    """The tests the package grades, as the grader counts them: collected with their points, a test needing GPUs
    this machine lacks not graded. Counted here, not written down, as the exercises gain tests."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.jsonl"
        files = [ROOT / "tests" / "test_ex00_warmup.py", ROOT / "tests" / "test_ex05_ddp.py",
                 *sorted(hidden.glob("test_*.py"))]
        # rootdir /: every node id keeps its path (hidden/test_ex00_*.py lies outside the course's folder)
        done = subprocess.run([PYTHON, "-m", "pytest", *map(str, files), "--collect-only", "-q", "-p", "no:randomly",
                               "--rootdir", "/", "-c", str(ROOT / "pyproject.toml"), "--course-report", str(report)],
                              cwd=ROOT, capture_output=True, text=True, timeout=600)
        found = read_report(report)
        collected = found.collected if found is not None else None
    assert collected, done.stdout[-2000:] + done.stderr[-2000:]
    return [t for t in collected if t.points is not None]


def _visible_points(gradescope, exercise: str) -> float:
    return sum(t.possible for t in gradescope["expected"] if t.exercise == exercise and "/hidden/" not in t.nodeid)


# The syntax-error run gets this test's limit cut in the unpacked package: run_autograder must apply the limits it
# ships (and never measure its own), so that test must stop at it and say how the limits were set.
SHIPPED_LIMIT_CUT = ("tests/test_ex00_warmup.py::test_shard_range_rejects_bad_input", 0.05)


def _run(root: Path, package: Path, files: dict[str, bytes | str], cut_limit: bool = False, **env: str) -> dict:
    for folder in ("source", "submission", "results"):
        (root / folder).mkdir(parents=True)
    _unpack(package, root / "source")
    if cut_limit:
        settings = root / "source" / "settings" / "gradescope.json"
        config = json.loads(settings.read_text())
        config["time_limits"][SHIPPED_LIMIT_CUT[0]] = SHIPPED_LIMIT_CUT[1]
        settings.write_text(json.dumps(config))
    for name, data in files.items():
        (root / "submission" / name).write_bytes(data.encode() if isinstance(data, str) else data)
    # The autograder's own bound on a submission (the package's --timeout) and its start, never a constant of ours
    limit = json.loads((root / "source" / "settings" / "gradescope.json").read_text())["timeout"] + JUDGE_START
    started = time.monotonic()
    done = subprocess.run(["bash", str(root / "source" / "run_autograder")], cwd=root, capture_output=True,
                          text=True, timeout=limit, env={**GRADER_ENV, "AUTOGRADER_ROOT": str(root),
                                                         "COURSE_PYTHON": PYTHON, **env})
    results = json.loads((root / "results" / "results.json").read_text())
    return {"done": done, "seconds": time.monotonic() - started, "results": results, "root": root,
            "tests": {t["name"]: t for t in results["tests"]}}


@pytest.fixture(scope="module")
def gradescope():
    # Readable by all, like an instructor's files: student code runs as a user of its own where the grader is root.
    base = Path(tempfile.mkdtemp(prefix="course-gradescope-test-"))
    os.chmod(base, 0o755)
    try:
        hidden = base / "hidden"
        hidden.mkdir()
        (hidden / "test_ex00_hidden.py").write_text(HIDDEN_TEST)
        (hidden / "test_ex00_hidden_gpu.py").write_text(GPU_HIDDEN_TEST)
        package = base / "autograder.zip"
        started = time.monotonic()
        # No limit of ours on the build: its calibration is the judge's run of the reference, which the judge bounds
        built = subprocess.run([PYTHON, "-m", "course_lib.grade", "gradescope", "--out", str(package), "--exercises",
                                "ex00,ex05", "--tests", str(hidden)], cwd=ROOT, capture_output=True, text=True,
                               timeout=HANG_GUARD, env=GRADER_ENV)
        assert built.returncode == 0, built.stdout + built.stderr
        runs = {"build": {"done": built, "seconds": time.monotonic() - started}, "expected": _collected(hidden)}
        for name, files in _submissions(base).items():
            # The grader's fallback where bubblewrap cannot run: a mount namespace hides the tests and the results.
            env = {"COURSE_GRADE_ISOLATION": "unshare"} if name == "cheating_in_the_fallback" else {}
            runs[name] = _run(base / name, package, files, cut_limit=name == "syntax_error", **env)
        yield {"package": package, "base": base, **runs}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _passed(run: dict) -> set[str]:
    return {name for name, t in run["tests"].items() if t.get("status") == "passed"}


@needs_solutions
def test_the_zip_has_gradescopes_layout_and_no_solutions(gradescope):
    with zipfile.ZipFile(gradescope["package"]) as package:
        names = package.namelist()
        modes = {i.filename: stat.S_IMODE(i.external_attr >> 16) for i in package.infolist()}
        config = json.loads(package.read("settings/gradescope.json"))
        texts = {n: package.read(n) for n in names}
    assert {"setup.sh", "run_autograder"} <= set(names) and modes["run_autograder"] & 0o111
    assert not any(n.startswith("solutions/") or "/solutions/" in n for n in names)
    solutions = [p.read_bytes() for p in (ROOT / "solutions").glob("ex*.py")]
    assert not any(data in solutions for data in texts.values()), "a reference solution travels in the package"
    assert "tests/hidden/test_ex00_hidden.py" in names and "tests/test_ex05_ddp.py" in names
    assert not any(n.startswith("tests/test_ex01") for n in names), "only the chosen exercises' tests"
    assert config["exercises"] == ["ex00", "ex05"] and config["exercise_files"] == ["ex00_warmup.py", "ex05_ddp.py"]
    assert texts["requirements.txt"] == ("\n".join(pinned_requirements()[0]) + "\n").encode(), "grading's only"
    # The limits were calibrated when the package was built, for every graded test, and are shipped.
    assert set(config["time_limits"]) == {t for t in config["graded_tests"] if "gpu" not in t}
    assert all(time_rule.FLOOR <= seconds <= 120 for seconds in config["time_limits"].values())


def test_setup_sh_is_valid_bash_and_installs_exactly_the_course_pins(tmp_path):
    from course_lib.instructor.grade.gradescope import RUN_AUTOGRADER, setup_script

    requirements, pins = pinned_requirements()
    script = setup_script(pins)
    for text in (script, RUN_AUTOGRADER):
        (tmp_path / "script.sh").write_text(text)
        checked = subprocess.run(["bash", "-n", str(tmp_path / "script.sh")], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
    constraints = [line for line in (ROOT / "constraints.txt").read_text().splitlines()
                   if line.strip() and not line.startswith("#")]
    assert pins == constraints == ["torch==2.14.1", "torchvision==0.29.1"]
    installs = [shlex.split(line) for line in script.splitlines() if " -m pip install " in line]
    cpu = next(words for words in installs if TORCH_CPU_INDEX in words)
    assert [w for w in cpu if "==" in w] == constraints, "torch and torchvision at the pinned versions, CPU builds"
    rest = next(words for words in installs if "-r" in words)
    assert rest[rest.index("-r") + 1].endswith("requirements.txt") and rest[rest.index("-c") + 1].endswith(
        "constraints.txt")
    assert requirements[:2] == ["torch>=2.11,<2.15", "torchvision>=0.26,<0.30"], "pyproject's own list"
    assert f"{VENV}/bin/python" in RUN_AUTOGRADER and "bubblewrap" in script


# What the autograder's requirements.txt must hold: grading's own packages, none of the lessons'.
GRADING_PACKAGES = ["torch", "torchvision", "pytest", "pytest-timeout", "hypothesis", "cloudpickle"]

# Run in a child whose Python sees only what requirements.txt installs (argv[1]: the distributions allowed, as
# JSON): every other installed package's modules are hidden from import, as on Gradescope. It then imports what
# grading imports: the graded tests and their conftest, course_lib.grading, course_lib.dist (the ranks, the fork
# server, which preloads torch._dynamo), the grader, and every reference solution and exercise stub as the ranks
# import a submission. Prints {"hidden": [modules hidden], "failed": {what: error}} as JSON.
IMPORT_WHAT_GRADING_IMPORTS = r"""
import importlib, importlib.metadata, importlib.util, json, pkgutil, re, sys
from pathlib import Path

root, allowed = Path.cwd(), set(json.loads(sys.argv[1]))
canonical = lambda name: re.sub(r"[-_.]+", "-", name).lower()
hidden = {module for module, dists in importlib.metadata.packages_distributions().items()
          if not any(canonical(d) in allowed for d in dists) and module not in sys.stdlib_module_names}


class Hide:  # every finder of sys.meta_path, blind to the hidden modules: importing one is a ModuleNotFoundError
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in hidden:
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None

    def __getattr__(self, name):
        return getattr(self.finder, name)


already = sorted(m for m in sys.modules if m.partition(".")[0] in hidden)
assert not already, already
sys.meta_path[:] = [Hide(finder) for finder in sys.meta_path]
failed = {}
modules = ["course_lib.grade"]
for package in ("course_lib.grading", "course_lib.dist", "course_lib.instructor.grade"):
    folder = root / package.replace(".", "/")
    modules += [package] + [f"{package}.{m.name}" for m in pkgutil.iter_modules([str(folder)]) if m.name != "__main__"]
for name in modules:
    try:
        importlib.import_module(name)
    except Exception as error:
        failed[name] = f"{type(error).__name__}: {error}"
files = [*sorted((root / "tests").glob("test_ex*.py")), root / "tests" / "conftest.py",
         *sorted((root / "solutions").glob("ex[0-9][0-9]_*.py")),
         *sorted((root / "exercises").glob("ex[0-9][0-9]_*.py"))]
for index, path in enumerate(files):
    try:
        spec = importlib.util.spec_from_file_location(f"graded_{index}_{path.stem}", path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except Exception as error:
        failed[str(path.relative_to(root))] = f"{type(error).__name__}: {error}"
print(json.dumps({"hidden": sorted(hidden), "imported": len(modules) + len(files), "failed": failed}))
"""


def _installed_closure(requirements: list[str]) -> set[str]:
    """The installed distributions these requirements bring, theirs included (markers evaluated here; extras not
    asked for left out)."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement

    from course_lib.instructor.grade.gradescope import requirement_name

    found, todo = set(), [requirement_name(r) for r in requirements]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:  # not installed here, e.g. required on another platform only
            continue
        found.add(name)
        for line in requires:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement_name(requirement.name))
    return found


def test_requirements_txt_is_pyprojects_dependencies_less_the_lessons_packages():
    from course_lib.instructor.grade.gradescope import (GRADING_IMPORTS, NOT_FOR_GRADING, pyproject_dependencies,
                                                        requirement_name)
    from pyproject_toml import pyproject

    dependencies = pyproject()["project"]["dependencies"]
    assert pyproject_dependencies() == dependencies, "gradescope.py reads pyproject.toml without tomllib (3.10)"
    requirements, _ = pinned_requirements()
    assert [requirement_name(r) for r in requirements] == GRADING_PACKAGES
    assert requirements == [d for d in dependencies if requirement_name(d) not in NOT_FOR_GRADING], "pyproject's pins"
    names = {requirement_name(d) for d in dependencies}
    assert {"jupyterlab", "ipywidgets", "nbclient"} <= set(NOT_FOR_GRADING) <= names
    assert set(GRADING_IMPORTS.replace(",", " ").split()) == {r.replace("-", "_") for r in GRADING_PACKAGES} | {"numpy"}


def test_grading_imports_nothing_that_requirements_txt_leaves_out():
    requirements, _ = pinned_requirements()
    # What Gradescope's venv holds (pip comes with it), and the course (here installed, there its source folder)
    allowed = _installed_closure(requirements) | {"pip", "multigpu-course"}
    assert "numpy" in allowed, "graded tests import numpy: torchvision must still bring it"
    assert not {"jupyterlab", "ipywidgets", "matplotlib", "nbclient", "ipykernel", "ipython"} & allowed, allowed
    done = subprocess.run([PYTHON, "-c", IMPORT_WHAT_GRADING_IMPORTS, json.dumps(sorted(allowed))], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert {"matplotlib", "ipywidgets", "IPython", "nbclient", "tqdm"} <= set(found["hidden"]), found["hidden"]
    assert found["imported"] > 50 and found["failed"] == {}, found["failed"]


@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck is not installed (Debian: apt-get install shellcheck; python3 course.py test "
                           "does it as root): the scripts are checked with bash -n only")
def test_setup_sh_and_run_autograder_pass_shellcheck(tmp_path):
    from course_lib.instructor.grade.gradescope import RUN_AUTOGRADER, setup_script

    for name, text in (("setup.sh", setup_script(pinned_requirements()[1])), ("run_autograder", RUN_AUTOGRADER)):
        (tmp_path / name).write_text(text)
        linted = subprocess.run(["shellcheck", "-s", "bash", str(tmp_path / name)], capture_output=True, text=True)
        assert linted.returncode == 0, f"{name}:\n{linted.stdout}"


@needs_solutions
def test_every_results_json_follows_gradescopes_schema(gradescope):
    for name in ("correct", "partial", "empty", "syntax_error", "cheating", "cheating_in_the_fallback"):
        jsonschema.validate(gradescope[name]["results"], RESULTS_SCHEMA)
        assert gradescope[name]["done"].returncode == 0, gradescope[name]["done"].stderr[-2000:]


@needs_solutions
def test_a_correct_zipped_course_folder_gets_every_point_and_hidden_tests_wait_for_publishing(gradescope):
    run = gradescope["correct"]
    results, tests = run["results"], run["tests"]
    graded = {name for name, t in tests.items() if "status" in t}
    expected = [t for t in gradescope["expected"] if t.graded]
    assert graded == _passed(run) and len(graded) == len(expected), run["done"].stdout[-3000:]
    assert results["score"] == sum(t["max_score"] for t in tests.values()) > 0
    assert tests["ex00: hidden test 1"]["visibility"] == "after_published"
    assert tests["ex00: hidden test 1"]["output"] == "passed", "a hidden test says only whether it passed"
    gpu = tests["ex00: hidden test 2"]
    assert gpu["max_score"] == 0 and gpu["output"].startswith("not graded: needs 1 CUDA GPU"), gpu
    assert results["output"].startswith("Grading status: ok.")


@needs_solutions
def test_a_partial_submission_scores_what_it_got_right(gradescope):
    run = gradescope["partial"]
    assert _passed(run) == EX00_SHARD_RANGE
    assert run["results"]["score"] == sum(run["tests"][n]["max_score"] for n in EX00_SHARD_RANGE) == 4
    ex00, ex05 = _visible_points(gradescope, "ex00"), _visible_points(gradescope, "ex05")
    assert ex00 == 7 and ex05 > 0
    assert f"Visible tests: ex00 3 / {ex00:g} points, ex05 0 / {ex05:g} points." in run["results"]["output"]
    # ex05 is the untouched stub: each function still to write once, with its tests and points, and each test's
    # output its hint alone (Hypothesis's examples teach nothing where every input fails the same way)
    summary = next(line for line in run["results"]["output"].splitlines() if line.startswith("Not implemented yet"))
    assert "ex05 · bucket_assignment (" in summary and summary.count("ex05 · MiniDDP.__init__ (") == 1, summary
    stubbed = [t for name, t in run["tests"].items() if name.startswith("ex05") and "status" in t]
    assert stubbed and all(t["output"].startswith("ex05: ") and "not implemented yet (hint: " in t["output"]
                           and "\n" not in t["output"] for t in stubbed), stubbed[:2]
    assert "Hidden tests: 2 tests, whose results appear when your instructor publishes" in run["results"]["output"]
    failed = run["tests"]["ex00: test_all_reduce_mean_matches_single_process_mean"]
    assert failed["score"] == 0 and failed["output"], "a failed visible test says why"


@needs_solutions
def test_an_empty_submission_says_what_is_missing(gradescope):
    run = gradescope["empty"]
    assert run["results"]["score"] == 0 and not _passed(run)
    output = run["results"]["output"]
    assert "ex00_warmup.py is missing" in output and "ex05_ddp.py is missing" in output


@needs_solutions
def test_a_syntax_error_costs_only_its_exercise(gradescope):
    run = gradescope["syntax_error"]
    ex00 = {name for name in run["tests"] if name.startswith("ex00") and "status" in run["tests"][name]}
    cut = "ex00: " + SHIPPED_LIMIT_CUT[0].split("::")[1]
    assert _passed(run) == ex00 - {cut} and len(ex00) == sum(
        t.graded for t in gradescope["expected"] if t.exercise == "ex00")
    # The shipped limits are the ones applied: the test whose limit was cut in the package stopped at it.
    stopped = run["tests"][cut]["output"]
    assert "Timeout" in stopped and "measured on the instructor's machine when the autograder was built" in stopped
    output = run["results"]["output"]
    assert "ex05_ddp.py does not compile" in output and "SyntaxError" in output and "line " in output


@needs_solutions
@needs_root_linux
@pytest.mark.parametrize("run", ["cheating", "cheating_in_the_fallback"])
def test_a_cheat_gets_nothing_and_a_misnamed_file_is_named(gradescope, run):
    """In bubblewrap's sandbox and in the fallback (a mount namespace), the cheater reads no test and no setting and
    writes no result; its conftest.py and pytest.ini count for nothing; its correct ex05 under another name is said."""
    if run == "cheating" and BWRAP_PROBLEM:
        pytest.skip(f"the allow-list sandbox is NOT tested here: {BWRAP_PROBLEM}")
    if run == "cheating_in_the_fallback" and unshare_prefix(True) is None:
        pytest.skip("no mount namespace can be made here: the fallback is NOT tested")
    got = gradescope[run]
    assert got["results"]["extra_data"]["isolation"] == ("bwrap" if run == "cheating" else "unshare")
    assert got["results"]["score"] == 0 and not _passed(got)
    output = got["results"]["output"]
    assert "ex05_ddp.py is missing, and your submission has 'ex05_ddp (1).py': rename it" in output
    everything = json.dumps(got["results"])
    assert "cheater saw: []" in everything, everything[-3000:]
    assert not (got["root"] / "results" / "forged.json").exists()


@needs_root_linux
def test_without_any_sandbox_the_tests_settings_and_results_are_closed_to_the_students_user():
    """Gradescope's container may allow neither bubblewrap nor a mount namespace (Docker's defaults refuse both).
    Then student code runs as a user of its own (the venv setup.sh makes is readable by all), and file permissions,
    set by the package before grading, are what keep it from the hidden tests, the settings and the results."""
    base = Path(tempfile.mkdtemp(prefix="course-gradescope-perm-"))
    os.chmod(base, 0o755)
    try:
        source, results = base / "source", base / "results"
        for path, text in ((source / "course_lib" / "x.py", "library"), (source / "tests" / "hidden" / "t.py", "t"),
                           (source / "tests" / "test_ex00_warmup.py", "t"), (source / "settings" / "gradescope.json", "{}")):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            path.chmod(0o644)
            path.parent.chmod(0o755)
        close_to_students(source, results)
        probe = textwrap.dedent(f"""
            import os
            os.setgid(65534); os.setuid(65534)
            def can(action):
                try:
                    action(); return True
                except OSError:
                    return False
            print(can(lambda: open({str(source / "course_lib" / "x.py")!r}).read()),
                  can(lambda: open({str(source / "tests" / "hidden" / "t.py")!r}).read()),
                  can(lambda: os.listdir({str(source / "tests")!r})),
                  can(lambda: open({str(source / "settings" / "gradescope.json")!r}).read()),
                  can(lambda: open({str(results / "results.json")!r}, "w").write("{{}}")))
            """)
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
        assert done.stdout.split() == ["True", "False", "False", "False", "False"], done.stdout + done.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)


@needs_solutions
def test_run_autograder_writes_results_json_even_when_the_grader_cannot_start(tmp_path):
    root = tmp_path / "root"
    for folder in ("source", "submission"):
        (root / folder).mkdir(parents=True)
    from course_lib.instructor.grade.gradescope import RUN_AUTOGRADER

    (root / "source" / "run_autograder").write_text(RUN_AUTOGRADER)
    done = subprocess.run(["bash", str(root / "source" / "run_autograder")], capture_output=True, text=True,
                          env={**os.environ, "AUTOGRADER_ROOT": str(root), "COURSE_PYTHON": "/nonexistent/python"})
    results = json.loads((root / "results" / "results.json").read_text())
    jsonschema.validate(results, RESULTS_SCHEMA)
    assert done.returncode == 0 and results["score"] == 0 and "could not grade" in results["output"]



MISNAMINGS = [lambda n: n.replace(".py", " (1).py"), lambda n: n.replace("_", "-", 1), str.title,
              lambda n: n.split("_")[0] + "_mine.py", lambda n: n + ".txt"]


@settings(max_examples=40, deadline=None)
@given(layout=st.sampled_from(["loose", "course folder", "zip of loose", "zip of course folder"]),
       misnamed=st.lists(st.sampled_from(range(len(MISNAMINGS))), min_size=2, max_size=2).map(tuple),
       which=st.sets(st.sampled_from(["ex00_warmup.py", "ex05_ddp.py"])))
def test_read_submission_finds_the_files_in_every_layout_and_names_the_misnamed(layout, misnamed, which):
    from course_lib.instructor.grade.gradescope import read_submission

    expected = ["ex00_warmup.py", "ex05_ddp.py"]
    names = {n: (MISNAMINGS[misnamed[i]](n) if n in which else n) for i, n in enumerate(expected)}
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        prefix = "course-main/exercises/" if "course" in layout else ""
        files = {prefix + wanted: f"# {original}\nx = 1\n" for original, wanted in names.items()}
        files[prefix.replace("exercises/", "") + "README.md"] = "notes\n"
        if layout.startswith("zip"):
            with zipfile.ZipFile(folder / "submission.zip", "w") as archive:
                for name, text in files.items():
                    archive.writestr(name, text)
        else:
            for name, text in files.items():
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_text(text)
        got = read_submission(folder, expected)
    for original, wanted in names.items():
        if original == wanted:
            assert got.files[original] == f"# {original}\nx = 1\n".encode()
        else:
            assert original not in got.files
            assert any(f"{original} is missing, and your submission has '{wanted}': rename it" in p
                       for p in got.problems), (wanted, got.problems)
    assert bool(got.problems) == bool(which)


@pytest.mark.parametrize("source, says", [
    ("def f(:\n    pass\n", "SyntaxError: invalid syntax (line 1"),
    ("x = 1\n\0\n", "null bytes"),
    ("x = " + "(" * 300 + ")" * 300 + "\n", "too many nested parentheses"),
    ("def f():\nreturn 1\n", "IndentationError: expected an indented block"),
])
def test_a_file_that_does_not_compile_is_said_and_costs_only_its_exercise(tmp_path, source, says):
    from course_lib.instructor.grade.gradescope import read_submission

    (tmp_path / "ex00_warmup.py").write_text("x = 1\n")
    (tmp_path / "ex05_ddp.py").write_bytes(source.encode())
    got = read_submission(tmp_path, ["ex00_warmup.py", "ex05_ddp.py"])
    problem = next(p for p in got.problems if p.startswith("ex05_ddp.py does not compile"))
    assert says in problem and "tests of ex05 count as failed" in problem
    assert len(got.problems) == 1 and got.files["ex00_warmup.py"] == b"x = 1\n"


def test_the_students_summary_shows_visible_points_and_gpu_tests_but_not_hidden_points():
    from course_lib.grading.results import TestOutcome
    from course_lib.instructor.grade.gradescope import student_summary
    from course_lib.instructor.grade.report import Result

    tests = [TestOutcome("tests/test_ex00_warmup.py::test_a", 2, "passed"),
             TestOutcome("tests/test_ex00_warmup.py::test_b", 3, "failed"),
             TestOutcome("tests/test_ex00_warmup.py::test_gpu", 1, "skipped", not_graded="needs 1 CUDA GPU"),
             TestOutcome("tests/hidden/test_ex00_hidden.py::test_h", 5, "passed")]
    lines = student_summary(Result("s", "ok", "", tests))
    assert lines[0] == "Visible tests: ex00 2 / 5 points."
    assert lines[1].startswith("Hidden tests: 1 test,") and "5" not in lines[1]
    assert lines[2].startswith("Not graded here: 1 test needing a GPU")
