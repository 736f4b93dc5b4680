"""How graded gloo ranks share a few cores: gloo's network thread yields, and ranks keep to a core each.

The graders' runner asks for these (course_lib.grading.runner); learners' `launch` leaves gloo as torchrun runs it,
so that lessons 04-05 measure the real latency.
"""

from __future__ import annotations

import os

__all__ = ["yield_gloo_network_thread", "keep_to_one_core"]


def yield_gloo_network_thread() -> None:
    """Give gloo's network threads (one per process group, named gloo_tcp_loop) the lowest priority, nice 19.

    A peer's message that arrives before this rank posted its receive stays unread in the socket (gloo tcp/pair.cc:
    "Buffer not (yet) registered"), so epoll_wait returns at once, again and again: the thread spins until the
    rank's own thread gets to the receive, on the core it needs (2 cores, 3 ranks, 16-byte all_reduce: 0.75 ms of
    spin per call; 2.2-3.0 ms a call at nice 0, 0.85-1.15 ms at nice 19). Threads of groups made since the last call
    too; one already at 19 is left alone. Linux only.
    """
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return
    for tid in threads:
        try:
            with open(f"/proc/self/task/{tid}/comm") as name:
                if name.read().strip() != "gloo_tcp_loop":
                    continue
            if os.getpriority(os.PRIO_PROCESS, int(tid)) < 19:
                os.setpriority(os.PRIO_PROCESS, int(tid), 19)
        except OSError:  # gone since listed
            pass


def keep_to_one_core(rank: int) -> None:
    """Keep every thread of this rank (gloo's network threads included; later ones inherit it) on one core: rank r
    on the r-th usable core, modulo their number. For ranks with a thread each, no more cores than ranks.

    A collective's steps pass from gloo's network thread to the rank's own thread: on one core a switch, across
    cores a wake-up of another (2 cores, tiny tensors, per call: 2 ranks all_reduce 0.78-0.98 ms free, 0.28-0.39 ms
    kept; 3 ranks all_gather 0.89-0.91 ms, 0.61-0.67 ms). Not where launches share the cores (two judges: no faster).
    """
    try:
        cores = sorted(os.sched_getaffinity(0))
        threads = os.listdir("/proc/self/task")
    except (AttributeError, OSError):  # not Linux
        return
    if len(cores) < 2:
        return
    for tid in threads:
        try:
            os.sched_setaffinity(int(tid), {cores[rank % len(cores)]})
        except OSError:  # gone since listed
            pass
