"""Hard-codes two rounds (d = 1, then 2), as for four ranks: from five ranks on, ranks 4 and up get nothing."""

LOSES = ["test_tree_broadcast_copies_the_source_in_log_rounds"]


def tree_broadcast(tensor, src):
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - src) % n
    for d in (1, 2):
        if v < d and v + d < n:
            dist.send(tensor.contiguous(), (v + d + src) % n)
        elif d <= v < 2 * d:
            buffer = torch.empty_like(tensor, memory_format=torch.contiguous_format)
            dist.recv(buffer, (v - d + src) % n)
            tensor.copy_(buffer)
    return tensor
