"""Sends every tensor to rank 0, which sums them and sends the sum back: the right values, but no ring."""

LOSES = ["test_ring_all_reduce_sums_along_a_ring"]


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    total = tensor.detach().clone()
    if rank == 0:
        buffer = torch.empty_like(total)
        for peer in range(1, n):
            dist.recv(buffer, peer)
            total += buffer
        for peer in range(1, n):
            dist.send(total, peer)
    else:
        dist.send(total, 0)
        dist.recv(total, 0)
    return total
