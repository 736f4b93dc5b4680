"""Who keeps graded ranks to a core each: check's, alone on the machine; never the judges' (dist.sharing_cores)."""

from __future__ import annotations

from pathlib import Path

from course_lib import check
from course_lib.grading import GRADED_RUN_ENV, ONE_CORE_PER_RANK
from course_lib.grading.runner import _graded_job
from course_lib.instructor.grade.judge import judge_env


def _nothing(rank, world_size):
    return None


def test_checks_pytest_asks_for_a_core_per_rank_and_the_graded_environment():
    env = check._pytest_env()
    assert env[ONE_CORE_PER_RANK] == "1"
    assert {k: env[k] for k in GRADED_RUN_ENV} == GRADED_RUN_ENV


def test_the_runner_keeps_ranks_to_a_core_only_when_asked(monkeypatch):
    monkeypatch.delenv(ONE_CORE_PER_RANK, raising=False)
    job = _graded_job(_nothing, (), "solutions", 2, 30.0)
    assert not job.one_core_per_rank and job.yield_gloo_network_thread
    monkeypatch.setenv(ONE_CORE_PER_RANK, "1")
    assert _graded_job(_nothing, (), "solutions", 2, 30.0).one_core_per_rank


def test_a_judge_never_inherits_it(monkeypatch, tmp_path: Path):
    # Judges run two at a time on the cores: kept to a core, a rank could not move to the one the other left idle.
    monkeypatch.setenv(ONE_CORE_PER_RANK, "1")
    assert ONE_CORE_PER_RANK not in judge_env(tmp_path)
    assert ONE_CORE_PER_RANK not in judge_env(tmp_path, sandboxed=True)
