"""Exercise 04: collectives from point-to-point messages, and reading bandwidth figures.

Notebook: notebooks/04_collectives.ipynb

The distributed functions run inside ranks started by `course_lib.dist.launch` (or the tests'
runner): a process group is already initialised, and every rank calls the function with a tensor
of the same shape and dtype. Use only point-to-point messages here (`dist.send`/`dist.recv`,
`dist.isend`/`dist.irecv`, `dist.batch_isend_irecv`): the built-in collectives are what the tests
compare you with, and they are switched off while your code runs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Return the element-wise sum of `tensor` over all ranks, computed by a ring of send/recv messages.

    The same answer as `dist.all_reduce(t, op=dist.ReduceOp.SUM)` on a copy, for any shape, any
    number of elements (not only multiples of the world size) and any world size; every rank gets
    the same values. Leave `tensor` unchanged.

    The algorithm (notebook 04, section 5): flatten a copy and split it into world_size chunks with
    `torch.tensor_split` (some may be empty). Rank r sends to (r + 1) % n and receives from
    (r - 1) % n. Reduce-scatter: in step s = 0 .. n-2, send chunk (r - s) % n and add the chunk you
    receive into chunk (r - s - 1) % n; afterwards rank r holds the full sum of chunk (r + 1) % n.
    All-gather: in step s = 0 .. n-2, send chunk (r + 1 - s) % n and overwrite chunk (r - s) % n with
    what you receive. Each rank sends 2(n-1)/n of the data in all.
    """
    # BEGIN SOLUTION: follow the docstring; in each step isend() to the right, recv() from the left, then wait() on the send (a blocking send on every rank at once can deadlock); skip empty chunks on both sides
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = tensor.detach().clone().reshape(-1)
    chunks = list(torch.tensor_split(flat, n))  # views into flat: writing a chunk writes flat
    right, left = (rank + 1) % n, (rank - 1) % n

    def exchange(send_index: int, recv_index: int, accumulate: bool) -> None:
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

    for step in range(n - 1):  # reduce-scatter
        exchange((rank - step) % n, (rank - step - 1) % n, accumulate=True)
    for step in range(n - 1):  # all-gather
        exchange((rank + 1 - step) % n, (rank - step) % n, accumulate=False)
    return flat.reshape(tensor.shape)
    # END SOLUTION


def tree_broadcast(tensor: torch.Tensor, src: int) -> torch.Tensor:
    """Copy `src`'s `tensor` into `tensor` on every rank along a binomial tree; return `tensor`.

    Like `dist.broadcast(tensor, src)` (in place: on return every rank's `tensor` holds src's
    values), but in ceil(log2(n)) rounds of send/recv. Number the ranks relative to the source,
    v = (rank - src) % n. In round k (k = 0, 1, ...), with d = 2**k: a rank with v < d that already
    has the data sends it to relative rank v + d (if v + d < n); the rank with d <= v < 2d receives
    from relative rank v - d. Convert relative ranks back with (v + src) % n.
    """
    # BEGIN SOLUTION: loop d = 1, 2, 4, ... while d < n; senders have v < d, receivers d <= v < 2d; real rank = (v + src) % n
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - src) % n
    d = 1
    while d < n:
        if v < d and v + d < n:
            dist.send(tensor.contiguous(), (v + d + src) % n)
        elif d <= v < 2 * d:
            buffer = torch.empty_like(tensor)
            dist.recv(buffer, (v - d + src) % n)
            tensor.copy_(buffer)
        d *= 2
    return tensor
    # END SOLUTION


def all_gather_p2p(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Return the list of every rank's `tensor`, in rank order, built from point-to-point messages.

    The same as `out = [torch.empty_like(tensor) for _ in range(n)]; dist.all_gather(out, tensor)`.
    Every rank sends its tensor to every other rank and receives theirs. Post all the sends and
    receives together with `dist.batch_isend_irecv` (PyTorch's version of NCCL's group calls), so
    no rank waits for another to finish first, then wait on every request.
    """
    # BEGIN SOLUTION: one dist.P2POp(dist.isend, ...) and one dist.P2POp(dist.irecv, ...) per other rank; batch_isend_irecv(ops) returns requests to wait() on
    rank, n = dist.get_rank(), dist.get_world_size()
    out = [torch.empty_like(tensor) for _ in range(n)]
    out[rank].copy_(tensor)
    mine = tensor.contiguous()
    ops = []
    for peer in range(n):
        if peer != rank:
            ops.append(dist.P2POp(dist.isend, mine, peer))
            ops.append(dist.P2POp(dist.irecv, out[peer], peer))
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    return out
    # END SOLUTION


def bus_bandwidth_factor(collective: str, world_size: int) -> float:
    """The factor nccl-tests multiplies algorithm bandwidth by to get bus bandwidth, for `world_size` ranks.

    collective is one of 'all_reduce' (2(n-1)/n), 'reduce_scatter', 'all_gather', 'all_to_all'
    ((n-1)/n), 'broadcast', 'reduce' (1). Raise ValueError for any other name or world_size < 1.
    """
    # BEGIN SOLUTION: a dict from name to a function of n; n - 1 over n for the scatter/gather family
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}")
    n = world_size
    factors = {
        "all_reduce": 2 * (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_gather": (n - 1) / n,
        "all_to_all": (n - 1) / n,
        "broadcast": 1.0,
        "reduce": 1.0,
    }
    if collective not in factors:
        raise ValueError(f"unknown collective {collective!r}; expected one of {sorted(factors)}")
    return factors[collective]
    # END SOLUTION


def bandwidths(collective: str, size_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """Algorithm and bus bandwidth in GB/s (10**9 bytes per second), as nccl-tests reports them.

    size_bytes is S in nccl-tests: the size of the whole array (for all_reduce, one rank's tensor;
    for all_gather, the gathered output; for reduce_scatter, the input before scattering).
    algbw = S / seconds; busbw = algbw * bus_bandwidth_factor(collective, world_size).
    Raise ValueError if seconds <= 0 or size_bytes < 0.
    """
    # BEGIN SOLUTION: divide by 1e9 for GB/s; reuse bus_bandwidth_factor
    if seconds <= 0 or size_bytes < 0:
        raise ValueError(f"need seconds > 0 and size_bytes >= 0, got seconds={seconds}, size_bytes={size_bytes}")
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * bus_bandwidth_factor(collective, world_size)
    # END SOLUTION


def ring_all_reduce_time(size_bytes: int, world_size: int, alpha: float, beta: float) -> float:
    """Predicted seconds for a ring all-reduce of `size_bytes` under the alpha-beta model (notebook 04).

    A message of m bytes costs alpha + m * beta seconds (alpha: latency in s, beta: s per byte, the
    inverse of link bandwidth). The ring takes 2(n-1) steps, each sending one chunk of size_bytes / n
    bytes, so t = 2(n-1) * alpha + 2(n-1)/n * size_bytes * beta. One rank needs no messages: 0.0.
    """
    # BEGIN SOLUTION: 2 * (n - 1) steps, each alpha + (size_bytes / n) * beta
    n = world_size
    if n < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}")
    return 2 * (n - 1) * (alpha + size_bytes / n * beta)
    # END SOLUTION
