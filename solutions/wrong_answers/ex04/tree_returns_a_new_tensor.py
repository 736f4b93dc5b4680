"""Receives into a new tensor and returns it, leaving the caller's tensor unchanged (broadcast is in place)."""

LOSES = ["test_tree_broadcast_copies_the_source_in_log_rounds"]


def tree_broadcast(tensor, src):
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - src) % n
    data = tensor.clone()
    d = 1
    while d < n:
        if v < d and v + d < n:
            dist.send(data, (v + d + src) % n)
        elif d <= v < 2 * d:
            data = torch.empty_like(tensor)
            dist.recv(data, (v - d + src) % n)
        d *= 2
    return data
