"""Passes the tensors around a ring in n - 1 dependent steps, each rank forwarding what it just received."""

LOSES = ["test_all_gather_p2p_returns_every_rank_in_order"]


def all_gather_p2p(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    out = [torch.empty_like(tensor, memory_format=torch.contiguous_format) for _ in range(n)]
    out[rank].copy_(tensor)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        ops = [dist.P2POp(dist.isend, out[(rank - step) % n], right),
               dist.P2POp(dist.irecv, out[(rank - step - 1) % n], left)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    return out
