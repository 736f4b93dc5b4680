"""course_lib.dist.warm: a graded test's runs share their ranks, each starts as a fresh rank would, none outlives it."""

from __future__ import annotations

import os
import time

import pytest

from course_lib.dist import LaunchTimeout, RankFailed
from course_lib.dist.launcher import RankJob
from course_lib.dist import warm
from course_lib.dist.warm import ranks_kept, run_kept


def _who(rank, world_size, change=False):
    """The rank's pid and what a fresh rank starts with; with `change`, then spoils all of it for the next run."""
    import random

    import torch
    import torch.distributed as dist

    seen = {"pid": os.getpid(), "dtype": str(torch.get_default_dtype()), "grad": torch.is_grad_enabled(),
            "torch": torch.rand(2).tolist(), "python": random.random(), "cwd": os.getcwd()}
    if dist.is_initialized():
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        seen["sum"] = t.item()
    if change:
        torch.set_default_dtype(torch.float64)
        torch.set_grad_enabled(False)
        torch.manual_seed(123)
        random.seed(5)
        os.chdir("/")
    return seen


def _fail_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("rank one fails")
    return rank


def _sleep(rank, world_size, seconds):
    time.sleep(seconds)
    return rank


def _job(fn, world_size=2, *args, timeout=60.0, group=True):
    return RankJob(fn, world_size, args, backend="gloo", init_process_group=group, timeout=timeout, quiet=True,
                   plain_results=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def _gone(pids, seconds=10.0) -> bool:
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_runs_of_one_shape_share_the_ranks_and_start_fresh(world_size):
    with ranks_kept():
        first = run_kept(_job(_who, world_size, True))
        second = run_kept(_job(_who, world_size, True))
        third = run_kept(_job(_who, world_size))
    pids = [r["pid"] for r in first]
    assert [r["pid"] for r in second] == pids == [r["pid"] for r in third], "kept ranks: the same processes"
    want_sum = world_size * (world_size + 1) / 2
    for runs in (first, second, third):
        assert [r["sum"] for r in runs] == [want_sum] * world_size, "the process group still works"
    for later in (second, third):  # what the first run changed is put back before each further run
        for fresh, again in zip(first, later):
            assert {k: again[k] for k in ("dtype", "grad", "torch", "python", "cwd")} == {
                k: fresh[k] for k in ("dtype", "grad", "torch", "python", "cwd")}
    assert _gone(pids), "the kept ranks stop when the block ends"


def test_each_shape_keeps_its_own_ranks_and_outside_a_block_none_are_kept(monkeypatch):
    with ranks_kept():
        two = run_kept(_job(_who, 2))
        three = run_kept(_job(_who, 3))
        single = run_kept(_job(_who, 1, group=False))
        two_again = run_kept(_job(_who, 2))
        assert [r["pid"] for r in two_again] == [r["pid"] for r in two], "another shape in between keeps them"
        assert not {r["pid"] for r in three} & {r["pid"] for r in two}
    assert _gone([r["pid"] for r in two + three + single])
    monkeypatch.setattr(warm, "_active", False)  # as outside any test (the course's plugin keeps them in one)
    outside = [run_kept(_job(_who, 2)) for _ in range(2)]
    assert {r["pid"] for r in outside[0]}.isdisjoint(r["pid"] for r in outside[1]), "outside: new ranks each run"
    assert _gone([r["pid"] for r in outside[0] + outside[1]])


def _patch(rank, world_size):
    """What a test's driver does to switch a shortcut off: rebind a function of torch's, and of the course's."""
    import torch.distributed as dist

    import course_lib.tables

    dist.all_reduce = None
    course_lib.tables.plural = None
    course_lib.tables.added_by_a_test = len
    import torch

    torch.Tensor.counted_by_a_test = lambda self: 1
    torch.nn.Linear.forward = None  # as exercise 05's tests switch DistributedDataParallel.__init__ off
    return os.getpid()


def _untouched(rank, world_size):
    import torch
    import torch.distributed as dist

    import course_lib.tables

    return {"pid": os.getpid(), "all_reduce": callable(dist.all_reduce), "plural": callable(course_lib.tables.plural),
            "added": hasattr(course_lib.tables, "added_by_a_test"), "tensor": hasattr(torch.Tensor, "counted_by_a_test"),
            "linear": callable(torch.nn.Linear.forward)}


def _leave_a_thread(rank, world_size):
    import threading

    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    return os.getpid()


def test_an_exercise_keeps_its_ranks_across_its_tests_each_test_starting_as_new():
    pristine = {"all_reduce": True, "plural": True, "added": False, "tensor": False, "linear": True}
    with ranks_kept("exA"):
        first = run_kept(_job(_patch, 2))
        assert all(value is False for r in run_kept(_job(_untouched, 2)) for key, value in r.items()
                   if key in ("all_reduce", "plural", "linear")), "within one test, what a run changed stays"
    with ranks_kept("exA"):  # the exercise's next test: the same ranks, what the last test changed put back
        second = run_kept(_job(_untouched, 2))
        assert [r["pid"] for r in second] == first
        assert [{k: r[k] for k in pristine} for r in second] == [pristine] * 2
        threads = run_kept(_job(_leave_a_thread, 2))
        assert threads == first
        after = run_kept(_job(_untouched, 2))  # a thread left running cannot be put back: new ranks
        assert not {r["pid"] for r in after} & set(first)
        assert _gone(first)
    with ranks_kept("exB"):  # another exercise: new ranks
        other = run_kept(_job(_untouched, 2))
        assert not {r["pid"] for r in other} & {r["pid"] for r in after}
        assert _gone([r["pid"] for r in after])
    warm.release_all()
    assert _gone([r["pid"] for r in other])


def test_runs_of_other_time_limits_share_the_ranks_and_each_stops_at_its_own():
    with ranks_kept():
        long = run_kept(_job(_who, 2, timeout=60.0))
        short = run_kept(_job(_who, 2, timeout=15.0))
        assert [r["pid"] for r in short] == [r["pid"] for r in long], "the graded tests' limits (15-60 s) share ranks"
        started = time.monotonic()
        with pytest.raises(LaunchTimeout):
            run_kept(_job(_sleep, 2, 30, timeout=1.0))  # on ranks started for 60 s runs: stopped after 1 s all the same
        assert time.monotonic() - started < 20, "a run ends at its own limit, not the kept ranks' longest"
    assert _gone([r["pid"] for r in long])


def test_a_failed_or_stopped_run_leaves_no_rank_for_the_next():
    with ranks_kept():
        before = run_kept(_job(_who, 2))
        with pytest.raises(RankFailed, match="rank one fails"):
            run_kept(_job(_fail_on_rank_one, 2))
        assert _gone([r["pid"] for r in before]), "a failure stops every kept rank (the others may be stuck)"
        after = run_kept(_job(_who, 2))
        with pytest.raises(LaunchTimeout):
            run_kept(_job(_sleep, 2, 30, timeout=1.0))
        assert _gone([r["pid"] for r in after])
        again = run_kept(_job(_who, 2))
        assert [r["sum"] for r in again] == [3.0, 3.0]
    assert _gone([r["pid"] for r in again])
