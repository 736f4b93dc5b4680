"""The source sends to every other rank itself: one round per rank, all on the source's link."""

LOSES = ["test_tree_broadcast_copies_the_source_in_log_rounds"]


def tree_broadcast(tensor, src):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == src:
        requests = [dist.isend(tensor.contiguous(), peer) for peer in range(n) if peer != src]
        for request in requests:
            request.wait()
    else:
        buffer = torch.empty_like(tensor)
        dist.recv(buffer, src)
        tensor.copy_(buffer)
    return tensor
