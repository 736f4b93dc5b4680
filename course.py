#!/usr/bin/env python3
"""Set up and run the course: the two commands of the README.

    python3 course.py lab     install the course (once) and open JupyterLab on notebooks/
    python3 course.py test    install the course (once) and run every test, as CI does
    python3 course.py check ex01   grade your own exercises/ex01_*.py in the terminal

Only the standard library is used here, so this runs on a fresh Python 3.10+.
The course installs into the active virtual or conda environment; with none
active it creates `.venv/` beside this file and uses that.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
# Commands the course's own tests need from the system, and the Debian package of each.
SYSTEM_PACKAGES = {"bwrap": "bubblewrap"}  # the grader's sandbox; its tests are skipped, with the reason, without it


def say(message: str) -> None:
    print(f"[course] {message}", flush=True)


def environment_python() -> Path:
    """The Python that runs the course: the active environment's, or .venv's (created on demand)."""
    active = os.environ.get("VIRTUAL_ENV")
    if not active and os.environ.get("CONDA_DEFAULT_ENV") not in (None, "", "base"):
        active = os.environ.get("CONDA_PREFIX")  # a named conda env, not conda's base
    if active and Path(sys.prefix).resolve() == Path(active).resolve():
        return Path(sys.executable)
    if active:
        say(f"an environment is active ({active}) but python3 is not its Python; using {VENV} instead")
    if not (VENV / "bin" / "python").exists():
        say(f"creating a virtual environment in {VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    return VENV / "bin" / "python"


def install(python: Path) -> None:
    """pip-install the course and its pinned packages, skipped when pyproject.toml has not changed."""
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    stamp = Path(
        subprocess.run(
            [str(python), "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, check=True
        ).stdout.strip()
    ) / ".multigpu-course-installed"
    if stamp.exists() and stamp.read_text().strip() == f"{digest} {ROOT}":
        return
    say("installing the course and its packages (torch 2.14.1 is large: a few minutes the first time)")
    result = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "-e", str(ROOT)])
    if result.returncode != 0:
        sys.exit("[course] pip could not install the course; its message is above.")
    stamp.write_text(f"{digest} {ROOT}\n")


def ensure_system_packages(packages: dict[str, str]) -> None:
    """apt-get install the Debian packages of the missing commands where that can be done (root, apt-get); say so."""
    missing = sorted({package for command, package in packages.items() if shutil.which(command) is None})
    if not missing or not sys.platform.startswith("linux"):
        return
    names = " ".join(missing)
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        say(f"{names} missing, and it takes root and apt-get to install: the tests that need it are skipped")
        return
    say(f"installing {names} with apt-get (the tests that need it would be skipped without it)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    if subprocess.call(command, env=env) != 0:  # a fresh machine may not have the package lists yet
        subprocess.call(["apt-get", "update", "-q"], env=env)
        if subprocess.call(command, env=env) != 0:
            say(f"could not install {names}: the tests that need it are skipped")


def lab(python: Path, extra: list[str]) -> int:
    say("opening JupyterLab on notebooks/ (stop it with Ctrl-C)")
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in extra:
        extra = ["--allow-root", *extra]  # containers and cloud images often run as root
    return subprocess.call([str(python), "-m", "jupyter", "lab", f"--notebook-dir={ROOT / 'notebooks'}", *extra])


def pytest(python: Path, args: list[str]) -> int:
    return subprocess.call([str(python), "-m", "pytest", *args], cwd=ROOT)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"lab", "test", "check"}:
        print(__doc__)
        return 2
    command, extra = argv[0], argv[1:]
    python = environment_python()
    install(python)
    if command == "lab":
        return lab(python, extra)
    if command == "check":
        if not extra:
            sys.exit("[course] say which exercise, e.g.  python3 course.py check ex01")
        return subprocess.call([str(python), "-m", "course_lib.check", *extra], cwd=ROOT)
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
        if subprocess.call([str(python), "-m", "course_lib.instructor.selfcheck", check], cwd=ROOT) != 0:
            failed.append(check)
    say("step 3/3: the whole suite against the solutions (course library, notebooks, graded tests)")
    code = pytest(python, ["tests", "--target", "solutions", *extra])
    if failed:
        say(f"the self-check(s) above FAILED: {', '.join(failed)}")
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
