"""Every command the README shows works as written on a fresh machine with nothing activated: it goes through
`python3 course.py`, names a command course.py has, and those commands run from a bare python3."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.paths import ROOT

# What starts a command worth checking: python3 course.py, python -m, python, pytest, torchrun, at the start of a
# line or of inline code, or after `(`, `;`, `&&`, `|` or a `$ ` prompt (not `.venv/bin/python`, not
# `course_lib.dist.torchrun(`, not `pytest-xdist`, not "the pytest plugin" in a sentence).
COMMAND = re.compile(r"(?:^|[(;&|$])\s*((?:python3?|pytest|torchrun)(?=\s|$))")
# A line of a code block that activates an environment: bare commands after it, in that block, are fine.
ACTIVATION = re.compile(r"^\s*(?:conda activate|source \S*activate|\. \S*activate)\b")


def _course_py():
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_py", ROOT / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme_commands(text: str) -> list[tuple[str, bool]]:
    """(command, whether an environment was activated before it in its code block) for every command in the
    code blocks and inline code of a README."""
    found: list[tuple[str, bool]] = []
    prose: list[str] = []
    block: list[str] | None = None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            block = [] if block is None else None
            continue
        if block is None:
            prose.append(line)
            continue
        block.append(line)
        activated = any(ACTIVATION.match(earlier) for earlier in block[:-1])
        for match in COMMAND.finditer(line):
            command = re.split(r"\s+#|\)|;|&&", line[match.start(1):])[0].strip()  # up to a comment, `)`, `;`
            found.append((command, activated))
    for span in re.findall(r"`([^`\n]+)`", "\n".join(prose)):
        found += [(re.split(r"\s*(?:;|&&)\s*", span[match.start(1):])[0].strip(), False)
                  for match in COMMAND.finditer(span)]
    return found


# The course's README, and the one the student release ships instead (course_lib/instructor/release.py).
READMES = [path for path in (ROOT / "README.md", ROOT / "course_lib/instructor/learner_README.md") if path.exists()]


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def test_the_readme_shows_commands_and_they_are_found():
    commands = [command for command, _ in readme_commands(_readme())]
    assert "python3 course.py lab" in commands and "python3 course.py check ex01" in commands
    example = ("```bash\nls (python -m x.y); conda activate e\npython benchmarks/a.py\ngrading/   the pytest plugin\n"
               "```\nRun `pytest --target PATH` or `.venv/bin/python`.")
    assert readme_commands(example) == [
        ("python -m x.y", False), ("python benchmarks/a.py", False), ("pytest --target PATH", False)]
    assert readme_commands("```bash\nconda activate e\ntorchrun --standalone s.py   # one\n```") == [
        ("torchrun --standalone s.py", True)]


@pytest.mark.parametrize("readme", READMES, ids=lambda path: path.name)
def test_every_readme_command_goes_through_course_py(readme):
    def works_bare(command: str) -> bool:  # course.py, or a module of the standard library (venv, zipfile)
        words = command.split()
        return words[:2] == ["python3", "course.py"] or (
            words[:2] == ["python3", "-m"] and len(words) > 2 and words[2] in sys.stdlib_module_names)

    bare = [command for command, activated in readme_commands(readme.read_text())
            if not (works_bare(command) or activated)]
    assert not bare, ("these README commands need an activated environment that the README does not activate: "
                      f"write them as `python3 course.py ...` (see its usage): {bare}")


@pytest.mark.parametrize("readme", READMES, ids=lambda path: path.name)
def test_every_course_py_command_in_the_readme_exists(readme):
    known = set(_course_py().COMMANDS)
    unknown = []
    for command, _ in readme_commands(readme.read_text()):
        words = shlex.split(command) if command.startswith("python3 course.py") else []
        if len(words) > 2 and words[2] not in known:
            unknown.append(command)
    assert not unknown, f"course.py has no such command (it has {sorted(known)}): {unknown}"


@pytest.mark.parametrize("readme", READMES, ids=lambda path: path.name)
def test_the_readme_names_no_issue_numbers(readme):
    assert not re.search(r"\bissues? #?\d+", readme.read_text(), re.I), "learner-facing text names an issue number"


def _bare_python() -> tuple[str, dict[str, str]]:
    """python3 as a learner runs it: in the course's .venv, the Python that .venv was made from, with nothing
    activated; in another environment (a conda environment on a GPU machine), that environment, activated."""
    env = dict(os.environ)
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        return sys.executable, {**env, "VIRTUAL_ENV": sys.prefix}
    for name in ("VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(name, None)
    env["PATH"] = os.pathsep.join(entry for entry in env.get("PATH", "").split(os.pathsep)
                                  if not Path(entry).resolve().is_relative_to(Path(sys.prefix).resolve()))
    base = getattr(sys, "_base_executable", "") or ""
    if not base or Path(base).resolve().is_relative_to(Path(sys.prefix).resolve()):
        base = "/usr/bin/python3"
    return base, env


def _course(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    python, env = _bare_python()
    return subprocess.run([python, "course.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def installed():
    """The first command installs the course where the environment is not up to date (once); the others not."""
    done = _course("python", "-c", "pass", timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr


# Each command course.py passes through, and a quick run of it that must succeed: (arguments, what it prints).
PASSTHROUGH_RUNS = {
    "check": (["--help"], "usage:"),
    "pytest": (["--co", "-q", "tests/test_ex00_warmup.py"], "tests/test_ex00_warmup.py::"),
    "exercises": (["--help"], "usage:"),
    "selfcheck": (["--help"], "usage:"),
    "grade": (["--help"], "--out"),
    "release": (["--help"], "usage:"),
    "record-gpu-outputs": (["--help"], "usage:"),
    "torchrun": (["--help"], "--nproc-per-node"),
    "python": (["-c", "import sys, torch, course_lib; print(sys.prefix)"], str(Path(sys.prefix).resolve())),
}


def test_every_passthrough_command_has_a_run_here():
    assert set(PASSTHROUGH_RUNS) == set(_course_py().PASSTHROUGH)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("command", sorted(PASSTHROUGH_RUNS))
def test_a_passthrough_command_works_from_a_bare_python3(installed, command):
    args, shown = PASSTHROUGH_RUNS[command]
    done = _course(command, *args)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"python3 course.py {shlex.join([command, *args])} failed:\n{out[-3000:]}"
    assert shown in out, out[-3000:]
    assert "[course]" not in out, f"course.py installed again, or said something:\n{out[-3000:]}"


def test_an_unknown_command_prints_the_usage_and_exits_2():
    python, env = _bare_python()
    done = subprocess.run([python, "course.py", "no-such-command"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "there is no command 'no-such-command'" in done.stderr and "python3 course.py grade" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
