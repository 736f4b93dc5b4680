#!/usr/bin/env python3
"""Set up and run the course: the two commands of the README.

    python3 course.py lab     install the course (once) and open JupyterLab on notebooks/
    python3 course.py test    install the course (once) and run every test, as CI does
    python3 course.py check ex01   grade your own exercises/ex01_*.py in the terminal
    python3 course.py selfcheck mutants ex03   (course developers) the graded tests' mutation score

`test` passes what follows it to pytest: `-m browser` runs only the browser tests (every lesson in
JupyterLab in headless Chromium), `-m "not browser"` everything else. The browser tests need the
Python package playwright and Chromium: `test` installs them when they are asked for, and says so.

Only the standard library is used here, so this runs on a fresh Python 3.10+.
The course installs into the active virtual or conda environment; with none
active it creates `.venv/` beside this file and uses that.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BROWSER_EXTRA = "browser"  # pyproject.toml's optional dependencies of the browser tests: playwright
# Where the browser tests look for Chromium (tests/course/browser_lab.py): Debian's binary first.
CHROMIUM = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome")
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


LOCK = ROOT / "constraints.txt"  # the exact torch and torchvision a fresh environment gets

# Asks the environment's Python, without importing torch (seconds saved), where it lives and which torch it has.
_PROBE = """
import sys
from importlib import metadata
try:
    version = metadata.version("torch")
except metadata.PackageNotFoundError:
    version = ""
print(sys.prefix)
print(version)
"""


def _release(version: str) -> tuple[int, ...]:
    """(2, 11, 0) from '2.11.0+cu130', '2.11.0rc1' or '2.11'."""
    match = re.match(r"(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def supported_torch() -> tuple[str, str]:
    """The supported range from pyproject.toml's "torch>=LOW,<HIGH" (a regex: Python 3.10 has no tomllib)."""
    match = re.search(r'"torch>=([0-9.]+),<([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    if not match:
        sys.exit('[course] pyproject.toml must declare torch as "torch>=LOW,<HIGH"')
    return match.group(1), match.group(2)


def install(python: Path, extras: tuple[str, ...] = ()) -> None:
    """pip-install the course (with pyproject.toml's optional `extras`), keeping a torch in the supported range
    that the environment already has.

    A cloud GPU image's own torch (built for its driver) stays; elsewhere torch and torchvision come from
    constraints.txt. Skipped when nothing that decides the install has changed and the extras are there.
    """
    prefix, installed = (subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, check=True)
                         .stdout.splitlines() + [""])[:2]
    low, high = supported_torch()
    keep = bool(installed) and _release(low) <= _release(installed) < _release(high)
    decided = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + LOCK.read_bytes()
                             + (installed if keep else "").encode()).hexdigest()
    stamp = Path(prefix) / ".multigpu-course-installed"
    done = stamp.read_text().split() if stamp.exists() else []  # decided, root, then the extras installed
    if done[:2] == [decided, str(ROOT)] and set(extras) <= set(done[2:]):
        return
    if done[:2] != [decided, str(ROOT)]:
        done = [decided, str(ROOT)]
    for extra in extras:
        if extra not in done[2:]:
            say(f"installing what the {extra} tests need: the Python package "
                f"{', '.join(optional_dependencies().get(extra, [])) or extra} (pip)")
    wanted = sorted(set(done[2:]) | set(extras))
    target = f"{ROOT}[{','.join(wanted)}]" if wanted else str(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        if keep:
            # Freeze the torch that is here: pip may add what is missing (a torchvision for this torch,
            # jupyterlab, ...) but never replaces torch, and stops with a message if it would have to.
            constraints = Path(tmp) / "keep-torch.txt"
            constraints.write_text(f"torch=={installed}\n")
            say(f"keeping the torch {installed} this environment has (the course supports {low} to below {high}); "
                "installing the rest")
        else:
            constraints = LOCK
            if installed:
                say(f"torch {installed} here is outside the supported range ({low} to below {high}): "
                    "installing the course's own")
            say("installing the course and its packages (torch is large: a few minutes the first time)")
        result = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                                 "-c", str(constraints), "-e", target])
    if result.returncode != 0:
        sys.exit("[course] pip could not install the course; its message is above.")
    stamp.write_text(" ".join([decided, str(ROOT), *wanted]) + "\n")


def optional_dependencies() -> dict[str, list[str]]:
    """pyproject.toml's [project.optional-dependencies], read without tomllib (Python 3.10 has none)."""
    found: dict[str, list[str]] = {}
    inside = False
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("["):
            inside = line.strip() == "[project.optional-dependencies]"
        elif inside and "=" in line and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            found[name.strip()] = re.findall(r'"([^"]+)"', value)
    return found


def wants_browser_tests(pytest_args: list[str]) -> bool:
    """False when pytest's -m expression leaves the browser tests out (e.g. -m "not browser")."""
    for i, arg in enumerate(pytest_args):
        expression = pytest_args[i + 1] if arg == "-m" and i + 1 < len(pytest_args) else (
            arg[2:] if arg.startswith("-m") and arg != "-m" else None)
        if expression is not None and re.search(r"\bnot\s+browser\b", expression):
            return False
    return True


def chromium() -> str | None:
    for candidate in CHROMIUM:
        found = candidate if os.access(candidate, os.X_OK) else shutil.which(candidate)
        if found:
            return found
    return None


def can_apt_get() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get") is not None


def apt_get_install(packages: list[str]) -> bool:
    """apt-get install Debian packages (root only), updating the package lists once if the first try fails."""
    quiet = {"stdout": subprocess.DEVNULL, "env": {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}}
    command = ["apt-get", "install", "-y", "-q", *packages]
    if subprocess.run(command, **quiet).returncode == 0:
        return True
    subprocess.run(["apt-get", "update", "-q"], **quiet)  # a fresh machine may have no package lists yet
    return subprocess.run(command, **quiet).returncode == 0


def prepare_browser() -> None:
    """Chromium for the browser tests: apt-get installs Debian's where it is missing and we are root (CI);
    otherwise say that those tests will be skipped, and the command that would install it."""
    if chromium():
        return
    if can_apt_get():
        say("installing Debian's chromium for the browser tests (apt-get install -y chromium)")
        apt_get_install(["chromium"])
        if not chromium():
            sys.exit("[course] apt-get could not install chromium, which the browser tests need; skip those "
                     "tests with:  python3 course.py test -m \"not browser\"")
        return
    say("Chromium is missing, so the browser tests will be SKIPPED. To run them, install it "
        "(Debian/Ubuntu: sudo apt-get install -y chromium) and run this again.")


def ensure_system_packages(packages: dict[str, str]) -> None:
    """Install the Debian packages of the missing commands where that can be done (root, apt-get); say so."""
    missing = sorted({package for command, package in packages.items() if shutil.which(command) is None})
    if not missing or not sys.platform.startswith("linux"):
        return
    names = " ".join(missing)
    if not can_apt_get():
        say(f"{names} missing, and it takes root and apt-get to install: the tests that need it are SKIPPED "
            f"(Debian/Ubuntu: sudo apt-get install -y {names})")
        return
    say(f"installing {names} with apt-get (the tests that need it would be skipped without it)")
    if not apt_get_install(missing):
        say(f"could not install {names}: the tests that need it are SKIPPED")


def lab(python: Path, extra: list[str]) -> int:
    say("opening JupyterLab on notebooks/ (stop it with Ctrl-C)")
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in extra:
        extra = ["--allow-root", *extra]  # containers and cloud images often run as root
    return subprocess.call([str(python), "-m", "jupyter", "lab", f"--notebook-dir={ROOT / 'notebooks'}", *extra])


def pytest(python: Path, args: list[str]) -> int:
    return subprocess.call([str(python), "-m", "pytest", *args], cwd=ROOT)


def suite_workers(pytest_args: list[str], cores: int | None = None) -> list[str]:
    """pytest-xdist's `-n N --dist loadfile` for the whole suite: the grader's tests and the browser's lessons,
    each a long file that mostly waits on one process, then run side by side (CI: 10 minutes instead of 14).
    None where the caller chose (-n, -p no:xdist) or there is one core; at most 4 workers."""
    if any(arg == "-n" or arg.startswith(("-n", "--numprocesses")) or "xdist" in arg for arg in pytest_args):
        return []
    cores = os.cpu_count() or 1 if cores is None else cores
    return ["-n", str(min(4, cores)), "--dist", "loadfile"] if cores >= 2 else []


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"lab", "test", "check", "selfcheck"}:
        print(__doc__)
        return 2
    command, extra = argv[0], argv[1:]
    python = environment_python()
    browser = command == "test" and wants_browser_tests(extra)
    install(python, (BROWSER_EXTRA,) if browser else ())
    if browser:
        prepare_browser()
    if command == "lab":
        return lab(python, extra)
    if command == "selfcheck":  # stubs | wrong-answers | mutants: course_lib/instructor/selfcheck.py
        return subprocess.call([str(python), "-m", "course_lib.instructor.selfcheck", *extra], cwd=ROOT)
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
    workers = suite_workers(extra)
    say("step 3/3: the whole suite against the solutions (course library, notebooks, graded tests)"
        + (f", in {workers[1]} pytest workers (pytest-xdist, one test file per worker)" if workers else ""))
    code = pytest(python, ["tests", "--target", "solutions", *workers, *extra])
    if failed:
        say(f"the self-check(s) above FAILED: {', '.join(failed)}")
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
