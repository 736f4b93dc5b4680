"""Cuts the tensor with torch.chunk, which makes fewer than world_size chunks when they do not divide evenly."""

LOSES = ["test_ring_all_reduce_sums_along_a_ring"]


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = tensor.detach().clone().reshape(-1)
    chunks = list(torch.chunk(flat, n))  # 2 elements over 4 ranks: 2 chunks, not 4
    right, left = (rank + 1) % n, (rank - 1) % n

    def exchange(send_index, recv_index, accumulate):
        outgoing, incoming = chunks[send_index], chunks[recv_index]
        request = dist.isend(outgoing.contiguous(), right) if outgoing.numel() else None
        if incoming.numel():
            buffer = torch.empty_like(incoming)
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
