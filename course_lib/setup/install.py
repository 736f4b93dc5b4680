"""Installing the course (the README's set-up, before notebook 00): the environment it runs in (the active one, or
.venv/), and when and what pip installs there, keeping a supported torch that the environment already has.
Standard library only: course.py runs this with the system python3.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

from course_lib.paths import ROOT
from course_lib.setup import say
from course_lib.setup.pip_progress import pip_with_progress

VENV = ROOT / ".venv"
BROWSER_EXTRA = "browser"  # pyproject.toml's optional dependencies of the browser tests: playwright
TEST_EXTRA = "test"  # and of the course's own suite: vermin (the Python 3.10 check), tomli on Python 3.10
EXTRA_USERS = {BROWSER_EXTRA: "the browser tests", TEST_EXTRA: "the course's own tests"}


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
        try:
            venv.EnvBuilder(with_pip=True).create(VENV)
        except (OSError, subprocess.CalledProcessError) as error:
            shutil.rmtree(VENV, ignore_errors=True)
            sys.exit(f"[course] could not create {VENV} ({error}). On Debian or Ubuntu, install Python's venv "
                     "module (sudo apt-get install -y python3-venv) and run this again.")
    return VENV / "bin" / "python"


LOCK = ROOT / "constraints.txt"  # the exact torch and torchvision a fresh environment gets
STAMP = ".multigpu-course-installed"  # in the environment's prefix: what the last install was decided on (JSON)

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


def install_inputs() -> str:
    """The digest of the files an install is decided on: pyproject.toml and constraints.txt."""
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + b"\0" + LOCK.read_bytes()).hexdigest()


def probe(python: Path) -> tuple[Path, str]:
    """The environment's prefix and its torch version ('' when it has none)."""
    done = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True)
    lines = done.stdout.splitlines()
    if done.returncode != 0 or not lines:
        sys.exit(f"[course] {python} does not run:\n{done.stderr.strip()}\n"
                 f"[course] delete {VENV} (or fix the active environment) and run this again.")
    return Path(lines[0]), (lines[1:] + [""])[0].strip()


def read_stamp(prefix: Path) -> dict:
    """What the last install recorded: {"inputs", "root", "torch", "extras"}; {} when there is none, and
    {"outdated": True} for a stamp an older course.py wrote."""
    try:
        stamp = json.loads((prefix / STAMP).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {"outdated": True}
    return stamp if isinstance(stamp, dict) else {"outdated": True}


def plan_install(torch: str, stamp: dict, extras: tuple[str, ...] | list[str], inputs: str, root: str,
                 supported: tuple[str, str]) -> dict | None:
    """What an install has to do, decided from the environment's torch, the last install's stamp and the extras
    this command needs; None when nothing. Otherwise {"what": "extras" (pip-install only those) or "course"
    (pip-install the course), "keep": keep the environment's torch, "extras": the extras to install,
    "why": a sentence for the learner}.

    The stamp records the torch an install LEFT (not the one it found), so the first command after an install
    finds everything current, whatever extras it asks for or leaves out.
    """
    low, high = supported
    keep = bool(torch) and _release(low) <= _release(torch) < _release(high)
    had = [extra for extra in stamp.get("extras", []) if isinstance(extra, str)]
    if not stamp:
        why = ""  # the first install: what it installs is said below
    elif stamp.get("outdated"):
        why = "the record of the last install comes from an older course.py; checking the install again"
    elif stamp.get("root") != root:
        why = f"the course was installed from {stamp.get('root')}; installing it from here"
    elif stamp.get("inputs") != inputs:
        why = "pyproject.toml or constraints.txt changed since the last install; installing again"
    elif stamp.get("torch") != torch:
        why = (f"this environment's torch changed since the last install ({stamp.get('torch') or 'none'} then, "
               f"{torch or 'none'} now); installing again")
    elif not keep:
        why = ""  # a torch outside the range that the last install left: what happens is said below
    else:
        missing = sorted(set(extras) - set(had))
        if not missing:
            return None
        return {"what": "extras", "keep": True, "extras": missing, "why": ""}
    return {"what": "course", "keep": keep, "extras": sorted(set(had) | set(extras)), "why": why}


@contextlib.contextmanager
def _install_lock(prefix: Path):
    """One install at a time per environment (two commands started together would run two pips)."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock (the course is untested there)
        yield
        return
    with open(prefix / (STAMP + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("another course.py is installing into this environment; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def install(python: Path, extras: tuple[str, ...] = ()) -> None:
    """pip-install the course (with pyproject.toml's optional `extras`) where `plan_install` says so, keeping a
    torch in the supported range that the environment already has.

    A cloud GPU image's own torch (built for its driver), or PyTorch's CPU-only wheel on a laptop, stays;
    elsewhere torch and torchvision come from constraints.txt.
    """
    prefix, torch = probe(python)
    inputs, supported = install_inputs(), supported_torch()
    plan = plan_install(torch, read_stamp(prefix), extras, inputs, str(ROOT), supported)
    if plan is None:
        return
    with _install_lock(prefix):
        prefix, torch = probe(python)  # again: another course.py may have installed while we waited
        stamp = read_stamp(prefix)
        plan = plan_install(torch, stamp, extras, inputs, str(ROOT), supported)
        if plan is None:
            return
        _pip_install(python, plan, torch, supported)
        torch_after = probe(python)[1]
        extras_after = set(plan["extras"]) | (set(stamp.get("extras", [])) if plan["what"] == "extras" else set())
        (prefix / STAMP).write_text(json.dumps({"inputs": inputs, "root": str(ROOT), "torch": torch_after,
                                                "extras": sorted(extras_after)}) + "\n")


def _pip_install(python: Path, plan: dict, torch: str, supported: tuple[str, str]) -> None:
    low, high = supported
    requirements = optional_dependencies()
    for extra in plan["extras"]:
        say(f"installing what {EXTRA_USERS.get(extra, 'the tests')} need: the Python package "
            f"{', '.join(requirements.get(extra, [])) or extra} (pip)")
    with tempfile.TemporaryDirectory() as tmp:
        if plan["keep"]:
            # Freeze the torch that is here: pip may add what is missing (a torchvision for this torch,
            # jupyterlab, ...) but never replaces torch, and stops with a message if it would have to.
            constraints = Path(tmp) / "keep-torch.txt"
            constraints.write_text(f"torch=={torch}\n")
        else:
            constraints = LOCK
        if plan["what"] == "extras":
            targets = [requirement for extra in plan["extras"] for requirement in requirements.get(extra, [])]
        else:
            if plan["why"]:
                say(plan["why"])
            if plan["keep"]:
                say(f"this environment already has torch {torch}, which the course supports ({low} up to, not "
                    f"including, {high}): it is left as it is, and only the course's other packages are installed")
            else:
                if torch:
                    say(f"this environment's torch {torch} is outside the supported range ({low} up to, not "
                        f"including, {high}): installing the course's own")
                say("installing the course and its packages (torch is large: a few minutes the first time)")
            wanted = plan["extras"]
            targets = ["-e", f"{ROOT}[{','.join(wanted)}]" if wanted else str(ROOT)]
        returncode = pip_with_progress([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                                        "-c", str(constraints), *targets])
    if returncode != 0:
        sys.exit("[course] pip could not install the course; its message is above. Check your network "
                 "connection and disk space, then run the same command again.")


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
