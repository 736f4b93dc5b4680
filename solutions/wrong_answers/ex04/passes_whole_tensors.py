"""Passes whole tensors around the ring n-1 times: the right sum, but n-1 times the data instead of 2(n-1)/n."""

LOSES = ["test_ring_all_reduce_sums_along_a_ring"]


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    total = tensor.detach().clone()
    message = tensor.detach().clone()
    for _ in range(n - 1):
        incoming = torch.empty_like(message)
        request = dist.isend(message, (rank + 1) % n)
        dist.recv(incoming, (rank - 1) % n)
        request.wait()
        total += incoming
        message = incoming
    return total
