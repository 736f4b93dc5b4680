"""Pads the flattened tensor with zeros to a multiple of the world size, so that every chunk has the same size."""

LOSES = ["test_ring_all_reduce_sums_along_a_ring"]


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    numel = tensor.numel()
    size = -(-numel // n) if numel else 0
    flat = torch.zeros(size * n, dtype=tensor.dtype, device=tensor.device)
    flat[:numel] = tensor.reshape(-1)
    chunks = list(flat.split(size)) if size else [flat] * n
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(2 * (n - 1)):
        reduce = step < n - 1
        send_index = (rank - step) % n if reduce else (rank + 1 - (step - n + 1)) % n
        recv_index = (send_index - 1) % n
        if not size:
            continue
        request = dist.isend(chunks[send_index].contiguous(), right)
        buffer = torch.empty_like(chunks[recv_index])
        dist.recv(buffer, left)
        if reduce:
            chunks[recv_index] += buffer
        else:
            chunks[recv_index].copy_(buffer)
        request.wait()
    return flat[:numel].reshape(tensor.shape)
