"""Receives into torch.zeros(shape, device=...), a float32 buffer whatever the tensor's dtype."""

LOSES = ["test_tree_broadcast_copies_the_source_in_log_rounds"]


def tree_broadcast(tensor, src):
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - src) % n
    d = 1
    while d < n:
        if v < d and v + d < n:
            dist.send(tensor.contiguous(), (v + d + src) % n)
        elif d <= v < 2 * d:
            buffer = torch.zeros(tensor.shape, device=tensor.device)  # no dtype=: float32
            dist.recv(buffer, (v - d + src) % n)
            tensor.copy_(buffer)
        d *= 2
    return tensor
