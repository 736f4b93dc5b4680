"""Ranks kept up for every run of one graded test: one fork, and one process group, for all its drawn inputs.

A graded test runs the learner's code on each input Hypothesis draws, each time in new ranks forked from the
fork server. With torch loaded, the kernel's copy of a process at fork and its teardown at exit cost 25-40 ms
(measured on this course's 2-core machines: `os.fork()` then `os._exit(0)` of a Python with torch imported
takes 23 ms, with what the fork server preloads 33-40 ms, against 0.8 ms without torch), and a gloo process
group another 30-60 ms: most of a graded test's time, where the learner's code takes milliseconds. Inside
`ranks_kept()` (the course's pytest plugin enters it around each test's call), `run_kept` starts the ranks of a
test's first run as `run_ranks` does, then sends the next runs of the same shape (world size, backend, timeout,
environment) to those same ranks, and stops them when the test ends. Each further run starts from what a new
rank would have (its random generators, default dtype, grad mode and threads put back: `rank._FreshState`);
a run that fails or runs out of time stops the kept ranks, and the next run starts new ones. Each test still
starts with new processes: nothing one test's run leaves behind reaches another test.
"""

from __future__ import annotations

import contextlib
import pickle
import time
from multiprocessing.connection import wait
from typing import Any

from course_lib.dist.launcher import RankJob, _Launch, _payload, run_ranks

__all__ = ["ranks_kept", "run_kept", "release"]


class KeptLaunch(_Launch):
    """A launch whose ranks, once they have returned, wait for further jobs instead of exiting."""

    def __init__(self, job: RankJob):
        super().__init__(job, keep=True)

    def run_again(self, job: RankJob) -> None:
        """Send the kept ranks another job (its own function, arguments and time); then wait() for its results."""
        self.job, self.payload, self.results = job, _payload(job), {}
        self.result_conns = dict(self.all_result_conns)
        message = pickle.dumps((self.payload, job.dump_stacks_after))
        for rank, conn in enumerate(self.job_conns):
            try:
                conn.send_bytes(message)
            except OSError:
                self._fail(rank, "the rank process had exited before this run (a crash, or os._exit())")
                raise self.failure from None

    def finish(self, grace: float = 2.0) -> None:
        """Tell the ranks no job follows, and give them `grace` seconds to destroy their process group and exit
        (close() then stops whatever is left)."""
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


_kept: KeptLaunch | None = None
_shape: tuple | None = None
_active = False


def _shape_of(job: RankJob) -> tuple:
    """What kept ranks must share with a job to run it: everything fixed when they started. (Not this process's
    environment, which torch itself changes as it goes, TORCHINDUCTOR_CACHE_DIR once set: kept ranks keep the one
    they started with, and a graded test sets none.)"""
    return (job.world_size, job.backend, job.init_process_group, job.timeout, job.plain_results, job.prefix_output,
            job.gloo_ranks_see_no_gpu, id(job.confinement), tuple(sorted((job.env or {}).items())))


@contextlib.contextmanager
def ranks_kept():
    """Within this block, run_kept() keeps ranks up between runs of the same shape; they stop when it ends."""
    global _active
    outer, _active = _active, True
    try:
        yield
    finally:
        _active = outer
        release(graceful=True)


def run_kept(job: RankJob) -> list[Any]:
    """run_ranks(job), on the ranks the previous run of the same shape left up, inside ranks_kept()."""
    global _kept, _shape
    if not _active:
        return run_ranks(job)
    shape = _shape_of(job)
    if _kept is not None and shape != _shape:
        release(graceful=True)
    try:
        if _kept is None:
            _kept, _shape = KeptLaunch(job), shape
            _kept.start()
        else:
            _kept.run_again(job)
        return _kept.wait()
    except BaseException:
        release(graceful=False)  # a rank may be stuck in a collective, or still looping: stop them all now
        raise


def release(graceful: bool = True) -> None:
    """Stop the kept ranks, if any: graceful lets them destroy their process group and exit first."""
    global _kept, _shape
    kept, _kept, _shape = _kept, None, None
    if kept is None:
        return
    try:
        if graceful:
            kept.finish()
    finally:
        kept.close()
