"""course_lib.grading.collective_log: what a rank's collectives log holds, and the process group working after it."""

from __future__ import annotations

import torch

from course_lib.dist import launch


def _logged_then_plain(rank, world_size):
    import torch.distributed as dist
    from torch._C._distributed_c10d import ProcessGroup

    from course_lib.grading.collective_log import CollectiveLog

    before = {name: ProcessGroup.__dict__.get(name) for name in ("allreduce", "barrier", "_allgather_base")}
    with CollectiveLog() as log:
        dist.all_reduce(torch.ones(3))
        log.active = False
        dist.all_reduce(torch.ones(5))  # not logged
        log.active = True
        dist.barrier()
    # After the log: every method as it was (pybind's descriptor, not its unwrapped function), and each still binds
    # the group as self: barrier() and all_reduce() work (they failed with "incompatible function arguments").
    after = {name: ProcessGroup.__dict__.get(name) for name in before}
    dist.barrier()
    total = torch.ones(2)
    dist.all_reduce(total)
    return {"events": log.events, "restored": before == after, "total": total}


def test_collective_log_logs_what_runs_and_puts_every_method_back():
    for result in launch(_logged_then_plain, 2, quiet=True):
        assert [event[:4] for event in result["events"]] == [["allreduce", 3, "torch.float32", "SUM"],
                                                               ["barrier", 0, "", None]]
        assert result["restored"]
        torch.testing.assert_close(result["total"], torch.full((2,), 2.0))
