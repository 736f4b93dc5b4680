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


def _ring_pass(rank, world_size):
    import torch.distributed as dist

    from course_lib.grading.collective_log import CollectiveLog

    with CollectiveLog() as log:
        outgoing, incoming = torch.full((4,), float(rank)), torch.empty(4)
        right, left = (rank + 1) % world_size, (rank - 1) % world_size
        requests = [dist.isend(outgoing, right), dist.irecv(incoming, left)]
        for request in requests:
            request.wait()
        dist.send(outgoing, left) if rank % 2 else dist.recv(incoming, right)
        dist.recv(incoming, right) if rank % 2 else dist.send(outgoing, left)
    return log.events


def test_sends_and_receives_log_their_peer_as_the_groups_rank():
    # isend/irecv, then send/recv in the other direction, on three ranks: the peer is the rank each names
    for rank, events in enumerate(launch(_ring_pass, 3, quiet=True)):
        right, left = (rank + 1) % 3, (rank - 1) % 3
        peers = [(e[0], e[5]) for e in events]
        assert peers[:2] == [("send", right), ("recv", left)], events
        assert sorted(peers[2:]) == sorted([("send", left), ("recv", right)]), events
        assert all(len(e) == 5 for e in events if e[0] not in ("send", "recv")), events
