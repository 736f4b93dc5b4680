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

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BROWSER_EXTRA = "browser"  # pyproject.toml's optional dependencies of the browser tests: playwright
TEST_EXTRA = "test"  # and of the course's own suite: vermin (the Python 3.10 check), tomli on Python 3.10
EXTRA_USERS = {BROWSER_EXTRA: "the browser tests", TEST_EXTRA: "the course's own tests"}
# Where the browser tests look for Chromium (tests/course/browser_lab.py): Debian's binary first.
CHROMIUM = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome")
# Commands the course's own tests need from the system, and the Debian package of each.
# bwrap: the grader's sandbox; shellcheck: checks the Gradescope package's scripts. Without them, the tests that need
# them are skipped, with the reason.
SYSTEM_PACKAGES = {"bwrap": "bubblewrap", "shellcheck": "shellcheck"}


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
        say(f"installing what {EXTRA_USERS.get(extra, f'the {extra} tests')} need: the Python package "
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


PIP_HEARTBEAT = 10.0  # seconds: the most the install stays silent


def pip_with_progress(command: list[str], heartbeat: float = PIP_HEARTBEAT) -> int:
    """Run pip, showing its progress in a few lines instead of pip's hundreds (or, with -q, nothing for minutes).

    Each package pip starts on is counted; a line says what it is doing at least every `heartbeat` seconds
    ("[course] pip: 23 packages so far, now torchvision (1 min 5 s)"), and when it installs and has installed.
    pip's warnings and errors (its stderr) are shown as pip prints them.
    """
    import threading
    import time

    started, state = time.monotonic(), {"said": time.monotonic(), "packages": 0, "now": "resolving", "lines": []}
    lock, done = threading.Lock(), threading.Event()

    def elapsed() -> str:
        seconds = round(time.monotonic() - started)
        return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"

    def tell(message: str) -> None:
        with lock:
            state["said"] = time.monotonic()
        print(f"[course] pip: {message} ({elapsed()})", flush=True)

    def heartbeat_loop() -> None:
        while not done.wait(1.0):
            if time.monotonic() - state["said"] >= heartbeat:
                tell(f"{state['packages']} packages so far, now {state['now']}")

    def stop(signum, frame):  # SIGTERM or SIGHUP here: pip stops too (Ctrl-C reaches it from the terminal anyway)
        raise KeyboardInterrupt

    previous = {number: signal.signal(number, stop) for number in (signal.SIGTERM, signal.SIGHUP)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, errors="replace")
    thread = threading.Thread(target=heartbeat_loop, daemon=True)
    thread.start()
    try:
        for line in process.stdout:
            state["lines"] = (state["lines"] + [line.rstrip()])[-40:]
            found = re.match(r"(Collecting|Requirement already satisfied:|Obtaining|Processing) +(\S+)", line)
            if found:  # a name (torch==2.14.1, numpy), or a path or URL (the course itself: its last part)
                state["packages"] += 1
                last = found.group(2).rstrip("/").rsplit("/", 1)[-1]  # torch==2.14.1, or torch-2.14.1-cp311-...whl
                state["now"] = re.split(r"[=<>!~\[;]", last.split("-")[0] if last.endswith(".whl") else last)[0]
            elif line.startswith("Installing collected packages:"):
                names = line.split(":", 1)[1].split(",")
                state["now"] = f"installing {len(names)} packages"
                tell(f"{state['packages']} packages resolved; installing {len(names)} of them")
            elif line.startswith("Successfully installed"):
                tell(f"installed {len(line.split()) - 2} packages")
        returncode = process.wait()
    finally:
        done.set()
        if process.poll() is None:
            process.kill()
            process.wait()
        for number, handler in previous.items():
            signal.signal(number, handler)
    if returncode != 0 and state["lines"]:  # what pip printed last, for the message below
        print("\n".join(state["lines"][-15:]), file=sys.stderr)
    return returncode


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


STOP_GRACE = 6.0  # seconds a stopped command has to stop what it started; then whatever is left is SIGKILLed
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


class Stopped(KeyboardInterrupt):
    """The command was stopped by a signal (Ctrl-C, SIGTERM, SIGHUP); course.py exits with 128 + its number."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def run_child(command: list[str], cwd: Path | None = None, interrupt: int = signal.SIGINT,
              outside_group=lambda pid: True) -> int:
    """Run `command` and return its exit code; if this process is stopped, stop it and everything it started.

    The command runs in a session of its own, so that it and what it starts can be signalled as one process group
    (a terminal's Ctrl-C reaches it from here, once). Ctrl-C, SIGTERM or SIGHUP here is passed on to that group
    (Ctrl-C as `interrupt`); STOP_GRACE seconds later, whatever is still running is SIGKILLed: the group, and every
    process below this one for which `outside_group(pid)` holds, even in a session of its own (a kernel, a judge, a
    browser of the tests) or orphaned meanwhile (this process adopts them, as a Linux "subreaper"). Then Stopped is
    raised.
    """
    received: list[tuple[int, float]] = []  # (signal, when)
    process: subprocess.Popen | None = None
    below_at_signal: dict[int, int] = {}  # pid -> start time of every process below this one at the first signal

    def pass_on(signum: int) -> None:
        if process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, interrupt if signum == signal.SIGINT else signum)

    def on_signal(signum, frame) -> None:
        if not received:
            _adopt_orphans()
            below_at_signal.update(_below(os.getpid(), _processes()))
        received.append((signum, time.monotonic()))
        pass_on(signum)

    handled = [getattr(signal, name) for name in STOP_SIGNALS if hasattr(signal, name)]
    previous = {number: signal.signal(number, on_signal) for number in handled}
    try:
        process = subprocess.Popen(command, cwd=cwd, start_new_session=True)
        if received:  # a signal came while the command was being started
            pass_on(received[0][0])
        while process.poll() is None and not received:
            time.sleep(0.2)  # polled: a signal handler cannot end a blocking wait
        if not received:
            return process.returncode
        signum, when = received[0]
        _stop_everything(process, below_at_signal, when + STOP_GRACE, signum, outside_group)
        raise Stopped(signum)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if process is not None and process.poll() is None:  # an error here: never leave the command behind
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _stop_everything(process: subprocess.Popen, below_at_signal: dict[int, int], deadline: float, signum: int,
                     outside_group) -> None:
    """Wait until the stopped command and everything below this process (that `outside_group` takes) are gone, up to
    `deadline`; then SIGKILL what is left, and reap what this process adopted."""
    def left() -> set[int]:
        everything = _processes()
        known = {pid for pid, start in below_at_signal.items() if everything.get(pid, (0, None))[1] == start}
        return {pid for pid in (set(_below(os.getpid(), everything)) | known) - {os.getpid()}
                if pid == process.pid or outside_group(pid)}

    while time.monotonic() < deadline and (process.poll() is None or left()):
        time.sleep(0.05)
    killed = set()
    for _ in range(20):  # a killed parent's children come to this process: again until none is left
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        pids = left()
        if not pids and process.poll() is not None:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        time.sleep(0.05)
    process.wait()
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    if killed:
        say(f"{len(killed)} processes were still running {STOP_GRACE:g} s after {signal.Signals(signum).name}: "
            "killed")


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent's pid, start time) of every live process, from Linux's /proc ({} without one)."""
    found = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    fields = handle.read().rsplit(b")", 1)[1].split()
                if fields[0] != b"Z":  # a zombie has ended already
                    found[int(entry)] = (int(fields[1]), int(fields[19]))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _below(top: int, everything: dict[int, tuple[int, int]]) -> dict[int, int]:
    """pid -> start time of every process below `top`."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in everything.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, [top]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = everything[child][1]
            todo.append(child)
    return found


def _adopt_orphans() -> None:
    """Linux: processes below this one whose parent dies come to this one (not to init), so they are still found."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


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
        + (f", in {workers[1]} pytest workers (pytest-xdist: a test file, or one lesson in the browser, per worker)" if workers else ""))
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
