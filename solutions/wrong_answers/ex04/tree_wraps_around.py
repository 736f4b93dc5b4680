"""Sends to (v + d) % n without checking v + d < n: the tree wraps around, src gets its own data back."""

LOSES = ["test_tree_broadcast_copies_the_source_in_log_rounds"]


def tree_broadcast(tensor, src):
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - src) % n
    d = 1
    while d < n:
        request = dist.isend(tensor.contiguous(), ((v + d) % n + src) % n) if v < d else None
        if (v - d) % n < d:
            buffer = torch.empty_like(tensor, memory_format=torch.contiguous_format)
            dist.recv(buffer, ((v - d) % n + src) % n)
            tensor.copy_(buffer)
        if request is not None:
            request.wait()
        d *= 2
    return tensor
