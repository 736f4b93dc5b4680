"""Puts its own tensor first and the others after it, instead of every tensor at its rank's index."""

LOSES = ["test_all_gather_p2p_returns_every_rank_in_order"]


def all_gather_p2p(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    received = {peer: torch.empty_like(tensor) for peer in range(n) if peer != rank}
    ops = []
    for peer, buffer in received.items():
        ops.append(dist.P2POp(dist.isend, tensor.contiguous(), peer))
        ops.append(dist.P2POp(dist.irecv, buffer, peer))
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    return [tensor.clone()] + list(received.values())
