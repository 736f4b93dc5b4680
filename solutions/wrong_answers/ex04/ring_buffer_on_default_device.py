"""Allocates the receive buffer with torch.empty(shape, dtype=...), on the default device instead of the tensor's."""

LOSES = ["test_ring_all_reduce_sums_along_a_ring"]


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = tensor.detach().clone().reshape(-1)
    chunks = list(torch.tensor_split(flat, n))
    right, left = (rank + 1) % n, (rank - 1) % n

    def exchange(send_index, recv_index, accumulate):
        outgoing, incoming = chunks[send_index], chunks[recv_index]
        request = dist.isend(outgoing.contiguous(), right) if outgoing.numel() else None
        if incoming.numel():
            buffer = torch.empty(incoming.shape, dtype=incoming.dtype)  # no device=: the default device
            dist.recv(buffer, left)
            if accumulate:
                incoming += buffer
            else:
                incoming.copy_(buffer)
        if request is not None:
            request.wait()

    for step in range(n - 1):
        exchange((rank - step) % n, (rank - step - 1) % n, accumulate=True)
    for step in range(n - 1):
        exchange((rank + 1 - step) % n, (rank - step) % n, accumulate=False)
    return flat.reshape(tensor.shape)
