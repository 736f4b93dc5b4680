"""The grader's sandbox, piece by piece: allow-list, network, leftovers, users, time limits (the class is test_grade.py)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cloudpickle
import pytest

from course_lib.dist.forkserver import descendants, sandboxed
from course_lib.instructor.grade.bwrap import SandboxSpec, bwrap_argv, check_allow_list, write_sandboxed_python
from course_lib.instructor.grade.time_limits import calibrated_limits
from course_lib.paths import ROOT

from class_builder import copy_solutions_to
from test_grade import needs_bwrap

ROOT_USER = sys.platform.startswith("linux") and os.geteuid() == 0


def test_a_time_limit_is_a_multiple_of_the_reference_with_a_floor_and_a_ceiling():
    limits = calibrated_limits({"a": 0.2, "b": 3.0, "c": 100.0}, factor=4, floor=5, ceiling=120)
    assert limits == {"a": 5, "b": 12, "c": 120}


def test_a_course_checkout_is_never_shown_to_student_code(tmp_path):
    with pytest.raises(ValueError, match="solutions"):
        check_allow_list([ROOT])  # a whole checkout: its solutions/ (and .git) are inside
    (tmp_path / "a" / "b" / ".git").mkdir(parents=True)
    with pytest.raises(ValueError, match=".git"):
        check_allow_list([tmp_path])
    with pytest.raises(ValueError, match="contains"):
        check_allow_list([tmp_path / "a"], secrets=[tmp_path / "a" / "b"])
    check_allow_list([ROOT / "course_lib"])


@pytest.mark.skipif(not ROOT_USER, reason="users per student need root")
def test_one_grader_never_gets_a_user_another_holds_or_one_with_live_processes(tmp_path):
    from course_lib.instructor.grade.users import UidClaim

    locks = tmp_path / "locks"
    first = UidClaim(2, base=64900, locks=locks)
    busy = first.uids[-1] + 1
    sleeper = subprocess.Popen(["sleep", "60"], user=busy, group=busy, extra_groups=[])
    try:
        second = UidClaim(2, base=64900, locks=locks)
        assert not set(first.uids) & set(second.uids) and busy not in second.uids, (first.uids, second.uids)
        first.release()
        third = UidClaim(1, base=64900, locks=locks)
        assert third.uids == first.uids[:1]
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.fixture
def sandbox(tmp_path):
    """A sandboxed Python as the grader makes one (no cgroup), and a copy of the solutions outside the course."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    elsewhere = Path(tempfile.mkdtemp(prefix="course-copy-"))
    copy = copy_solutions_to(elsewhere, "solutions")
    argv = bwrap_argv(SandboxSpec(read_only=[ROOT / "course_lib"], writable=[scratch], secrets=[ROOT / "solutions"]),
                      root=ROOT_USER, bwrap=shutil.which("bwrap") or "bwrap")
    try:
        yield write_sandboxed_python(tmp_path / "sandboxed-python", argv), scratch, copy
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


PROBE = """
import json, os, socket, sys
seen = {"solutions": os.path.exists(sys.argv[1]), "copy": os.path.exists(sys.argv[2]),
        "course_lib": os.path.exists(sys.argv[3]), "scratch": os.access(sys.argv[4], os.W_OK)}
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[5])), timeout=3).close()
    seen["host service"] = "connected"
except OSError as error:
    seen["host service"] = type(error).__name__
import course_lib.grading.confinement
seen["import"] = course_lib.grading.confinement.__file__
print(json.dumps(seen))
"""


@needs_bwrap
def test_the_sandbox_shows_only_the_allow_list_and_no_network(sandbox):
    python, scratch, copy = sandbox
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        done = subprocess.run([str(python), "-c", PROBE, str(ROOT / "solutions"), str(copy), str(ROOT / "course_lib"),
                               str(scratch), str(server.getsockname()[1])], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"solutions": False, "copy": False, "course_lib": True, "scratch": True,
                    "host service": "ConnectionRefusedError",  # the sandbox's own loopback, where nothing listens
                    "import": str(ROOT / "course_lib" / "grading" / "confinement.py")}, seen


def _leave_a_stray(rank: int, world_size: int) -> int:
    import signal
    import time

    if os.fork() == 0:  # a grandchild that leaves the rank's session and ignores polite signals
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)
        os._exit(0)
    return os.getpid()


@needs_bwrap
def test_ranks_forked_in_the_sandbox_leave_nothing_behind_and_learners_get_the_plain_server_back(sandbox):
    from multiprocessing import forkserver

    from course_lib.dist import launch
    from course_lib.dist.launcher import RankJob, run_ranks
    from course_lib.grading.confinement import Confinement

    python, scratch, _ = sandbox
    job = RankJob(_leave_a_stray, 2, (), init_process_group=False, quiet=True, plain_results=True, timeout=120,
                  confinement=Confinement(cwd=str(scratch), fork_server_executable=str(python)))
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test modules are not in the sandbox
    pids = run_ranks(job)
    assert all(pid > 2 for pid in pids)  # the sandbox's own numbers: its init is 1, the fork server 2
    # Killed strays are reaped by the sandbox's init a moment later (until then /proc still lists them): under
    # load CI once saw one there. A stray that is really left sleeps 600 s, so 10 s of patience tells them apart.
    deadline = time.monotonic() + 10
    while len(left := descendants(forkserver._forkserver._forkserver_pid)) > 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(left) == 2, f"left in the sandbox: {left}"  # its init and the fork server, nothing else
    assert launch(_plain, 1, quiet=True) == [True] and not sandboxed()


def _plain(rank: int, world_size: int) -> bool:
    return True
