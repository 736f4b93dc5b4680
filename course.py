#!/usr/bin/env python3
"""Set up and run the course. Nothing to activate: every command installs the course first (once, into the
environment described below), then runs in the course's own Python.

For learners
    python3 course.py lab [OPTIONS]        JupyterLab on this folder, opening notebooks/00_welcome.ipynb
    python3 course.py check ex01           grade your own exercises/ex01_*.py in the terminal
    python3 course.py test [PYTEST_ARGS]   every test, as CI does

For instructors
    python3 course.py grade SUBMISSIONS --out OUT [...]   grade a class (the instructor's grader)
    python3 course.py release OUT [--zip]                 make the student release
    python3 course.py pytest [PYTEST_ARGS]                pytest in the course's folder, e.g. --target PATH

For course developers
    python3 course.py exercises                                         write exercises/ from solutions/
    python3 course.py selfcheck stubs|wrong-answers|mutants [exNN ...]   the course's own checks
    python3 course.py record-gpu-outputs EXECUTED.ipynb [...]           keep what GPU cells printed
    python3 course.py torchrun --standalone --nproc-per-node=4 SCRIPT   torchrun, one process per GPU
    python3 course.py python SCRIPT|-m MODULE|-c CODE [...]             the course's Python, e.g. a benchmark:
        python3 course.py python benchmarks/launch_overhead.py

Add --help after a command for its own options (python3 course.py grade --help). check, exercises, pytest,
selfcheck and test run in the course's folder (where pyproject.toml's pytest settings are); the others in the
folder you run them from, so their paths are yours.

`test` passes what follows it to pytest: `-m browser` runs only the browser tests (every lesson in
JupyterLab in headless Chromium), `-m "not browser"` everything else. The browser tests need the
Python package playwright and Chromium: `test` installs them when they are asked for, and says so.

Only the standard library is used here, so this runs on a fresh Python 3.10+.
The course installs into the active virtual or conda environment; with none
active it creates `.venv/` beside this file and uses that. It installs again only when pyproject.toml or
constraints.txt changes, or the environment's torch does. A torch in the supported range that the environment
already has is kept (a cloud image's, or PyTorch's CPU-only wheel on a laptop: see the README).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:  # run with python3 -P (or PYTHONSAFEPATH): course_lib is beside this file all the same
    sys.path.insert(0, str(ROOT))

# The standard-library modules course.py stands on (their names are course.py's too, as before they moved there):
# installing the course, what its tests need from the system, and running a command so that Ctrl-C stops it all.
from course_lib.setup import say  # noqa: E402
from course_lib.setup.install import (  # noqa: E402, F401
    BROWSER_EXTRA, EXTRA_USERS, LOCK, STAMP, TEST_EXTRA, VENV, environment_python, install, install_inputs,
    optional_dependencies, plan_install, probe, read_stamp, supported_torch)
from course_lib.setup.pip_progress import PIP_HEARTBEAT, pip_with_progress  # noqa: E402, F401
from course_lib.setup.processes import STOP_GRACE, STOP_SIGNALS, Stopped, run_child  # noqa: E402, F401
from course_lib.setup.system_packages import (  # noqa: E402, F401
    CHROMIUM, SYSTEM_PACKAGES, apt_get_install, can_apt_get, chromium, ensure_system_packages, prepare_browser)


def wants_browser_tests(pytest_args: list[str]) -> bool:
    """False when pytest's -m expression leaves the browser tests out (e.g. -m "not browser")."""
    for i, arg in enumerate(pytest_args):
        expression = pytest_args[i + 1] if arg == "-m" and i + 1 < len(pytest_args) else (
            arg[2:] if arg.startswith("-m") and arg != "-m" else None)
        if expression is not None and re.search(r"\bnot\s+browser\b", expression):
            return False
    return True


WELCOME = "notebooks/00_welcome.ipynb"  # what `lab` opens


def lab_command(python: Path, extra: list[str]) -> list[str]:
    """JupyterLab on the course's folder (notebooks/ and exercises/ both in its file browser), opening the
    welcome notebook."""
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in extra:
        extra = ["--allow-root", *extra]  # containers and cloud images often run as root
    return [str(python), "-m", "jupyter", "lab", f"--ServerApp.root_dir={ROOT}",
            f"--LabApp.default_url=/lab/tree/{WELCOME}", *extra]


def lab(python: Path, extra: list[str]) -> int:
    say(f"opening JupyterLab on {ROOT}, at {WELCOME}; your exercises are in exercises/ (stop it with Ctrl-C)")
    # Ctrl-C reaches JupyterLab as SIGTERM: it stops at once, with its kernels (SIGINT would ask "Shutdown this
    # Jupyter server (y/[n])?" and carry on after 5 s without an answer). Of what runs outside its process group,
    # only kernels and what they started are stopped: a web browser it opened stays open.
    return run_child(lab_command(python, extra), interrupt=signal.SIGTERM, outside_group=_kernel_or_below)


def _kernel_or_below(pid: int) -> bool:
    """A Jupyter kernel, or a process it started: they have JPY_PARENT_PID in their environment (jupyter_client)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return any(entry.startswith(b"JPY_PARENT_PID=") for entry in handle.read().split(b"\0"))
    except OSError:
        return False


def pytest(python: Path, args: list[str]) -> int:
    return run_child([str(python), "-m", "pytest", *args], cwd=ROOT)


def suite_workers(pytest_args: list[str], cores: int | None = None) -> list[str]:
    """pytest-xdist's options for the whole suite: a worker per core (at most 4): most tests start ranks, kernels or
    a browser of their own, so a third worker on 2 cores only queued them (load average 8, and the grader's time
    limits ran out); `--dist loadscope`, whose scopes tests/conftest.py makes the course's units (a test file, or one
    browser lesson), handed out longest first. None where the caller chose (-n, -p no:xdist) or there is one core."""
    if any(arg == "-n" or arg.startswith(("-n", "--numprocesses")) or "xdist" in arg for arg in pytest_args):
        return []
    cores = os.cpu_count() or 1 if cores is None else cores
    return ["-n", str(min(4, cores)), "--dist", "loadscope", "--no-loadscope-reorder"] if cores >= 2 else []


# The commands that pass what follows them to a module of the course's Python:
# name -> (the arguments after `python`, whether it runs in the course's folder rather than the caller's).
PASSTHROUGH: dict[str, tuple[tuple[str, ...], bool]] = {
    "check": (("-m", "course_lib.check"), True),
    "pytest": (("-m", "pytest"), True),
    "exercises": (("-m", "course_lib.exercises"), True),
    "selfcheck": (("-m", "course_lib.instructor.selfcheck"), True),
    "grade": (("-m", "course_lib.grade"), False),
    "release": (("-m", "course_lib.instructor.release"), False),
    "record-gpu-outputs": (("-m", "course_lib.instructor.record_gpu_outputs"), False),
    "torchrun": (("-m", "torch.distributed.run"), False),
    "python": ((), False),
}
COMMANDS = ("lab", "test", *PASSTHROUGH)


def main(argv: list[str]) -> int:
    if argv and argv[0] in {"-h", "--help", "help"}:
        print(__doc__)
        return 0
    if not argv or argv[0] not in COMMANDS:
        if argv:
            print(f"[course] there is no command {argv[0]!r}; the commands are: {', '.join(COMMANDS)}",
                  file=sys.stderr)
        print(__doc__)
        return 2
    command, extra = argv[0], argv[1:]
    module = PASSTHROUGH.get(command, ((), False))[0][1:2]
    if module and module[0].startswith("course_lib.") and not (ROOT / (module[0].replace(".", "/") + ".py")).exists():
        sys.exit(f"[course] '{command}' is an instructor's or course developer's command, and this copy of the course "
                 "(a student release) does not include it; ask your instructor, or use the course's full repository.")
    if command == "check" and not extra:
        sys.exit("[course] say which exercise, e.g.  python3 course.py check ex01")
    python = environment_python()
    browser = command == "test" and wants_browser_tests(extra)
    install(python, ((TEST_EXTRA,) if command == "test" else ()) + ((BROWSER_EXTRA,) if browser else ()))
    if browser:
        prepare_browser()
    if command == "lab":
        return lab(python, extra)
    if command in PASSTHROUGH:
        arguments, in_root = PASSTHROUGH[command]
        if command == "python" and os.name == "posix":  # the course's Python itself, its signals and terminal its own
            os.execv(str(python), [str(python), *extra])
        return run_child([str(python), *arguments, *extra], cwd=ROOT if in_root else None)
    return test(python, extra)


def test(python: Path, extra: list[str]) -> int:
    """`test`: every test, as CI does: the self-checks of the graded tests (stubs, wrong answers), then the whole
    suite against the solutions; in a student release, every test against the learner's exercises/."""
    if not (ROOT / "solutions").is_dir():  # a student release: grade the learner's own files
        say("no solutions/ here (a student release): running every test against your exercises/")
        return pytest(python, ["tests", "--target", "exercises", *extra])
    ensure_system_packages(SYSTEM_PACKAGES)
    checks = [("the graded tests against freshly made exercise stubs (every one must fail)", "stubs"),
              ("the wrong answers in solutions/wrong_answers/ (each must lose points on the tests it names)",
               "wrong-answers")]
    failed = []
    for step, (what, check) in enumerate(checks, 1):
        say(f"step {step}/3: {what}")
        if run_child([str(python), "-m", "course_lib.instructor.selfcheck", check], cwd=ROOT) != 0:
            failed.append(check)
    workers = suite_workers(extra)
    say("step 3/3: the whole suite against the solutions (course library, notebooks, graded tests)"
        + (f", in {workers[1]} pytest workers (pytest-xdist: a test file, or one lesson in the browser, per worker)"
           if workers else ""))
    # suite_progress: how many tests, then at least every 30 s how many are done, failed, and the time left
    code = pytest(python, ["tests", "--target", "solutions", "-p", "course_lib.instructor.suite_progress",
                           *workers, *extra])
    if failed:
        say(f"the self-check(s) above FAILED: {', '.join(failed)}")
        return 1
    return code


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt as stopped:  # the command below was stopped too (run_child), and says what it stopped
        sys.exit(128 + getattr(stopped, "signum", signal.SIGINT))
