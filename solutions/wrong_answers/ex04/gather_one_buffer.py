"""Makes the output list with [torch.empty_like(tensor)] * n: n references to one buffer, not n buffers."""

LOSES = ["test_all_gather_p2p_returns_every_rank_in_order"]


def all_gather_p2p(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    out = [torch.empty_like(tensor)] * n
    ops = []
    for peer in range(n):
        if peer != rank:
            ops.append(dist.P2POp(dist.isend, tensor.contiguous(), peer))
            ops.append(dist.P2POp(dist.irecv, out[peer], peer))
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    out[rank].copy_(tensor)
    return out
