"""Ranks kept up between graded runs: one fork and one process group for many drawn inputs, tests and exercises.

A graded test runs the learner's code on each input Hypothesis draws, each time in ranks forked from the fork
server. With torch loaded, the kernel's copy of a process at fork and its teardown at exit cost 25-40 ms (measured
on this course's 2-core machines: `os.fork()` then `os._exit(0)` of a Python with torch imported takes 23 ms, with
what the fork server preloads 33-40 ms, against 0.8 ms without torch), and a gloo process group 40-100 ms more
for two or three ranks: most of a graded test's time, where the learner's code takes milliseconds. Inside
`ranks_kept(GRADED)` (the course's pytest plugin enters it around each test's call), `run_kept` starts the
ranks of a run as `run_ranks` does, then sends later runs of the same shape (world size, backend, environment;
any time limit up to KEPT_RUN_SECONDS) to those same ranks, in this test and in the next tests, of this exercise
and the next ones (the plugin keeps every graded test in one group, GRADED). A further run starts as a new rank
would (course_lib.dist.fresh_state): the random
generators, dtype, grad mode, threads and folder are put back before each, and at a test's first run also every
function and class the last test's runs rebound. A run that fails or runs out of time stops every kept rank (one
may be stuck in a collective), a run that leaves a thread or a process running stops its own, and the next run
starts new ones. Measured over the nine exercises' graded tests (`--target solutions`, each file its own pytest
on this 2-core machine): 557 runs took 557 launches and 107.6 s of test time, then 39 launches and 69.8 s (of which
about 4 s per file is its fork server's start, in its first test). With one pytest for all nine (as a judge runs
them), kept per exercise and per time limit: 29 launches, 61 ranks; kept across exercises and limits: 6 launches,
16 ranks (an idle kept rank holds 46-49 MB of its own memory: the reference solutions' peak went from 1.2-1.3 to
1.4 GB, against a student's 4 GB).
"""

from __future__ import annotations

import contextlib
import pickle
import time
from multiprocessing.connection import wait
from typing import Any

from course_lib.dist.forkserver import kill_sandbox_processes, sandboxed
from course_lib.dist.launcher import RankJob, _Launch, _payload, run_ranks

__all__ = ["ranks_kept", "run_kept", "release_all", "MAX_KEPT_RANKS", "GRADED"]

GRADED = "graded"  # the group of every graded test's block (the course's plugin) and of the graders' warm-up

# At most this many ranks kept at once, enough for world sizes 1 to 5 side by side (exercise 04: the parametrized
# tests go through them in turn). An idle kept rank holds 46-49 MB of its own memory (measured with
# /proc/PID/smaps_rollup's Private lines: a student's memory limit counts them): the least recently used go first.
MAX_KEPT_RANKS = 16


class KeptLaunch(_Launch):
    """A launch whose ranks, once they have returned, wait for further jobs instead of exiting."""

    def __init__(self, job: RankJob):
        super().__init__(job, keep=True)
        self.block = 0  # the ranks_kept() block of its last run
        self.longest_run = _longest_run(job)

    def run_again(self, job: RankJob, new_test: bool) -> None:
        """Send the kept ranks another job (its own function, arguments and time); then wait() for its results."""
        self.job, self.payload, self.results = job, _payload(job), {}
        self.result_conns = dict(self.all_result_conns)
        message = pickle.dumps((self.payload, job.dump_stacks_after, new_test))
        for rank, conn in enumerate(self.job_conns):
            try:
                conn.send_bytes(message)
            except OSError:
                self._fail(rank, "the rank process had exited before this run (a crash, or os._exit())")
                raise self.failure from None

    def finish(self, grace: float = 2.0) -> None:
        """Tell the ranks no job follows, and give them `grace` seconds to destroy their process group and exit."""
        for conn in self.job_conns:
            conn.close()
        self.job_conns = []
        deadline = time.monotonic() + grace
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        while len(self.exited) < self.n and time.monotonic() < deadline:
            alive = [s for s, r in sentinels.items() if r not in self.exited]
            for ready in wait([*self.relay.streams, *alive], timeout=max(0.0, deadline - time.monotonic())):
                if ready in self.relay.streams:
                    self.relay.pump(ready)
                elif ready in sentinels:
                    self.exited.add(sentinels[ready])


_pools: dict[tuple, KeptLaunch] = {}  # by shape, the least recently used first
_group: Any = None
_block = 0
_active = False


# Kept ranks serve runs of any time limit up to this one (their collectives time out 10 s after it; each run still ends
# at its own limit, the parent's): the graded tests' limits, 15 to 60 s, share ranks.
KEPT_RUN_SECONDS = 600.0


def _longest_run(job: RankJob) -> float:
    return max(job.timeout, KEPT_RUN_SECONDS)


def _shape_of(job: RankJob) -> tuple:
    """What kept ranks must share with a job to run it: everything fixed when they started. (Not this process's
    environment, which torch itself changes as it goes, TORCHINDUCTOR_CACHE_DIR once set: kept ranks keep the one
    they started with, and a graded test sets none.)"""
    return (job.world_size, job.backend, job.init_process_group, _longest_run(job), job.plain_results,
            job.prefix_output, job.gloo_ranks_see_no_gpu, job.yield_gloo_network_thread, job.one_core_per_rank,
            id(job.confinement), tuple(sorted((job.env or {}).items())))


@contextlib.contextmanager
def ranks_kept(group: Any = None):
    """Within this block, run_kept() keeps ranks up between runs of the same shape.

    group None: they stop when the block ends. Otherwise they stay for the next block of the same group (the
    course's plugin: one block per test, all graded tests one group, so the exercises share ranks), and stop when a
    block of another group starts, or at release_all(); the first run of each block puts back what the last
    block's runs changed.
    """
    global _active, _group, _block
    if group is None or group != _group:
        release_all()
    _group, _block = group, _block + 1
    outer, _active = _active, True
    try:
        yield
    finally:
        _active = outer
        if group is None:
            release_all()


def run_kept(job: RankJob) -> list[Any]:
    """run_ranks(job), on ranks an earlier run of the same shape left up, inside ranks_kept()."""
    if not _active:
        return run_ranks(job)
    shape = _shape_of(job)
    kept = _pools.pop(shape, None)
    try:
        if kept is None:
            _make_room(job.world_size)
            kept = _pools[shape] = KeptLaunch(job)
            kept.start()
        else:
            _pools[shape] = kept  # now the most recently used
            kept.run_again(job, new_test=kept.block != _block)
        kept.block = _block
        results = kept.wait()
    except BaseException:
        release_all(graceful=False)  # a rank may be stuck in a collective, or still looping: stop them all now
        raise
    if not kept.reusable:
        _release(shape)
    return results


def _make_room(ranks: int) -> None:
    while _pools and sum(k.n for k in _pools.values()) + ranks > MAX_KEPT_RANKS:
        _release(next(iter(_pools)))


def _release(shape: tuple) -> None:
    """Stop one kept launch, the others staying up: where its ranks do not all exit in time, in a sandbox, the
    sweep that stops them stops the others too."""
    kept = _pools.pop(shape)
    try:
        kept.finish()
    finally:
        exited = len(kept.exited) == kept.n
        kept.close(sweep=not exited)
        if not exited and sandboxed():
            release_all(graceful=False)


def release_all(graceful: bool = True) -> None:
    """Stop every kept rank: graceful lets them destroy their process groups and exit first."""
    pools = list(_pools.values())
    _pools.clear()
    try:
        if graceful:
            for kept in pools:
                kept.job_conns, conns = [], kept.job_conns
                for conn in conns:
                    conn.close()  # all at once: they exit side by side
            for kept in pools:
                kept.finish()
    finally:
        if pools and sandboxed():
            kill_sandbox_processes()  # once for all (and whatever their runs started)
        for kept in pools:
            kept.close(sweep=False)
