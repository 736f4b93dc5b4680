"""Judges forked from the judge zygote are the judges Popen started: their environment, folder, session, log and exit
code; killed as a process group; none outlives the zygote, and the zygote none of them.

Each judge here runs pytest on a small test file of this folder's tmp_path (what it saw is written to a JSON file),
not the course's tests: the grader's own tests (test_grade.py, test_stopping_grader.py) grade real classes with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_lib.instructor.grade.judge import judge_env
from course_lib.instructor.grade.judge_zygote import JudgeZygote
from course_lib.stopping import PARENT_VARIABLE

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal, /proc")

SEEN = '''
import json, os, sys, tempfile

def test_what_the_judge_sees():
    with open(os.environ["SEEN"], "w") as handle:
        json.dump({"env": dict(os.environ), "cwd": os.getcwd(), "session_leader": os.getsid(0) == os.getpid(),
                   "group": os.getpgid(0), "pid": os.getpid(), "tmp": tempfile.gettempdir(),
                   "torch_loaded": "torch" in sys.modules}, handle)
    assert os.environ.get("FAIL") != "1"
'''

SLEEPS = '''
import os, time

def test_sleeps():
    open(os.environ["SEEN"], "w").write(str(os.getpid()))
    time.sleep(600)
'''


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    home = tmp_path_factory.mktemp("zygote-home")
    (home / "tmp").mkdir()
    zygote = JudgeZygote({**judge_env(home), "ONLY_IN_THE_ZYGOTE": "1"})
    yield zygote
    zygote.close()


def _judge_env(folder: Path, **extra: str) -> dict[str, str]:
    (folder / "tmp").mkdir(exist_ok=True)
    return {**judge_env(folder), "SEEN": str(folder / "seen.json"), PARENT_VARIABLE: str(os.getpid()), **extra}


def _start(zygote, folder: Path, source: str, **extra: str):
    (folder / "test_judge.py").write_text(source)
    env = _judge_env(folder, **extra)
    judge = zygote.start(["-q", "-p", "no:cacheprovider", str(folder / "test_judge.py")], env, folder,
                         folder / "judge.log")
    return judge, env


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_forked_judge_has_the_environment_folder_session_and_log_it_was_given(zygote, tmp_path):
    judge, env = _start(zygote, tmp_path, SEEN)
    assert judge.wait(timeout=120) == 0 and judge.returncode == 0, (tmp_path / "judge.log").read_text()
    seen = json.loads((tmp_path / "seen.json").read_text())
    for key, value in env.items():
        if key != PARENT_VARIABLE:  # the judge dies with the zygote instead, which set it and took it out
            assert seen["env"].get(key) == value, key
    assert "ONLY_IN_THE_ZYGOTE" not in seen["env"] and PARENT_VARIABLE not in seen["env"]
    assert seen["cwd"] == str(tmp_path) and seen["tmp"] == str(tmp_path / "tmp")
    assert seen["session_leader"] and seen["group"] == seen["pid"] == judge.pid
    assert seen["torch_loaded"], "the zygote imports torch before it forks"
    assert "1 passed" in (tmp_path / "judge.log").read_text()


def test_a_failing_judge_exits_with_pytests_code(zygote, tmp_path):
    judge, _ = _start(zygote, tmp_path, SEEN, FAIL="1")
    assert judge.wait(timeout=120) == 1
    assert "1 failed" in (tmp_path / "judge.log").read_text()


def test_a_judge_is_killed_as_a_process_group_and_says_so(zygote, tmp_path):
    judge, _ = _start(zygote, tmp_path, SLEEPS)
    with pytest.raises(subprocess.TimeoutExpired):
        judge.wait(timeout=0.1)
    deadline = time.monotonic() + 60
    while not (tmp_path / "seen.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(judge.pid, signal.SIGKILL)
    assert judge.wait(timeout=10) == -signal.SIGKILL


def test_judges_die_with_the_zygote_and_the_zygote_with_the_grader(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    zygote = JudgeZygote(judge_env(home))
    try:
        judge, _ = _start(zygote, tmp_path, SLEEPS)
        deadline = time.monotonic() + 60
        while not (tmp_path / "seen.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(judge.pid)
        zygote._process.kill()  # as if the grader's SIGKILL had reached it (parent-death signal: the same)
        assert judge.wait(timeout=10) < 0
        deadline = time.monotonic() + 10
        while _alive(judge.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(judge.pid), "a judge outlived its zygote"
    finally:
        zygote.close()


def test_closing_the_zygote_leaves_no_process(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    zygote = JudgeZygote(judge_env(home))
    judge, _ = _start(zygote, tmp_path, SEEN)
    assert judge.wait(timeout=120) == 0
    pid = zygote._process.pid
    zygote.close()
    assert not _alive(pid) and not _alive(judge.pid)


GRADER = '''
import sys, time
from pathlib import Path
from course_lib.instructor.grade.judge import judge_env
from course_lib.instructor.grade.judge_zygote import JudgeZygote

zygote = JudgeZygote(judge_env(Path(sys.argv[1])))
print(zygote._process.pid, flush=True)
time.sleep(600)
'''


def test_the_zygote_dies_with_a_sigkilled_grader(tmp_path):
    from course_lib.paths import ROOT

    grader = subprocess.Popen([sys.executable, "-c", GRADER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    zygote = None
    try:
        zygote = int(grader.stdout.readline())
        assert _alive(zygote)
        grader.kill()  # no finally runs: the zygote's parent-death signal must stop it
        grader.wait()
        deadline = time.monotonic() + 10
        while _alive(zygote) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(zygote), "the judge zygote outlived a SIGKILLed grader"
    finally:
        grader.kill()
        grader.wait()
        if zygote is not None and _alive(zygote):  # nothing left behind, even when the test fails
            os.kill(zygote, signal.SIGKILL)


def test_a_zygote_that_stopped_forks_nothing_more_and_says_so_once(tmp_path, capsys):
    home = tmp_path / "home"
    home.mkdir()
    zygote = JudgeZygote(judge_env(home))
    try:
        zygote._process.kill()
        zygote._process.wait()
        assert zygote.start(["-q"], _judge_env(tmp_path), tmp_path, tmp_path / "judge.log") is None
        assert zygote.start(["-q"], _judge_env(tmp_path), tmp_path, tmp_path / "judge.log") is None
        said = capsys.readouterr().err
        assert said.count("WARNING") == 1 and "each judge starts Python" in said, said
        assert zygote.stopped
    finally:
        zygote.close()
