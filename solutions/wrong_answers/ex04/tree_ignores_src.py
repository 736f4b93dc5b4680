"""Builds the binomial tree from rank 0 whatever src is (ranks not renumbered relative to the source)."""

LOSES = ["test_tree_broadcast_copies_the_source_in_log_rounds"]


def tree_broadcast(tensor, src):
    rank, n = dist.get_rank(), dist.get_world_size()
    d = 1
    while d < n:
        if rank < d and rank + d < n:
            dist.send(tensor.contiguous(), rank + d)
        elif d <= rank < 2 * d:
            buffer = torch.empty_like(tensor)
            dist.recv(buffer, rank - d)
            tensor.copy_(buffer)
        d *= 2
    return tensor
