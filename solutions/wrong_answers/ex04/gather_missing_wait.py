"""Posts the batch of sends and receives and returns without waiting on the requests."""

LOSES = ["test_all_gather_p2p_returns_every_rank_in_order"]


def all_gather_p2p(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    out = [torch.empty_like(tensor) for _ in range(n)]
    out[rank].copy_(tensor)
    ops = []
    for peer in range(n):
        if peer != rank:
            ops.append(dist.P2POp(dist.isend, tensor.contiguous(), peer))
            ops.append(dist.P2POp(dist.irecv, out[peer], peer))
    if ops:
        dist.batch_isend_irecv(ops)  # no wait(): the receives may not have arrived yet
    return out
