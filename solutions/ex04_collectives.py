"""Exercise 04: collectives from point-to-point messages, and reading bandwidth figures and cost models.

Notebook: notebooks/04_collectives.ipynb

The distributed functions run inside ranks started by `course_lib.dist.launch` (or the tests'
runner): a process group is already initialised, and every rank calls the function with a tensor
of the same shape and dtype. Use only point-to-point messages here (`dist.send`/`dist.recv`,
`dist.isend`/`dist.irecv`, `dist.batch_isend_irecv`): the built-in collectives are what the tests
compare you with, and they are switched off while your code runs, by whatever route they are reached.
The tests also record every message each rank sends and receives, to check the algorithm, not only
the result.
"""

from __future__ import annotations

import math
import re

import torch
import torch.distributed as dist


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Return the element-wise sum of `tensor` over all ranks, computed by the ring of notebook 04, section 5.

    The same answer as `dist.all_reduce(t, op=dist.ReduceOp.SUM)` on a copy, for any shape (0-d and empty
    included), any number of elements (not only multiples of the world size), any dtype, any memory layout
    (`tensor` may be a transposed view or a slice: not contiguous) and any world size: a new tensor of
    `tensor`'s shape and dtype; every rank gets the same values. Leave `tensor` unchanged. Make every buffer
    on `tensor`'s device with its dtype (`torch.empty_like`, or `dtype=`/`device=` taken from the tensor): the
    tests set another default device while your code runs.

    What makes it a ring, which the tests check besides the values: cut a flattened copy into world_size
    chunks with `torch.tensor_split` (some may be empty); rank r only ever sends to rank (r + 1) % n and
    receives from rank (r - 1) % n; every message is one chunk, in the tensor's dtype (no padding to a
    multiple of n); n - 1 reduce-scatter steps and n - 1 all-gather steps, so each rank sends at most
    2(n - 1) messages, 2(n - 1)/n of the data in all; and every request you start (isend, irecv) is waited
    on. Which chunk each rank sends in each step, and what it does with the chunk it receives, you read off
    the picture in section 5 and the table printed under it: find the rule behind the numbers, for any n.
    """
    # BEGIN SOLUTION: follow one chunk through the picture: which chunk does a rank send right after it received one? isend() to the right, recv() from the left, then wait() on the send (blocking sends on every rank at once deadlock); skip empty chunks on both sides
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
    """Copy `src`'s `tensor` into `tensor` on every rank in ceil(log2(n)) rounds of send/recv; return `tensor`.

    Like `dist.broadcast(tensor, src)`, in place: on return every rank's `tensor` holds src's values. In one
    round a rank sends at most one message, so every rank that already has the data can pass it to one rank
    that has not: the number of ranks holding it can double each round (a binomial tree). Decide who sends
    to whom in which round, for any src and any n (not only powers of two), so that ceil(log2(n)) rounds
    reach everyone. The tests count rounds (a rank that receives in round k can send from round k + 1 on,
    one message per round) and messages: no rank sends more than ceil(log2(n)), src receives nothing, every
    other rank receives src's tensor exactly once (n - 1 messages in all, nothing wraps around past src).
    `tensor` may be non-contiguous (a transposed view, a slice): receive into a contiguous buffer with its
    dtype and device, then copy into `tensor`; return that same object, not a new tensor.
    """
    # BEGIN SOLUTION: number the ranks relative to src, v = (rank - src) % n; after each round twice as many hold the data: who sends to whom so that they do?
    rank, n = dist.get_rank(), dist.get_world_size()
    v = (rank - src) % n
    d = 1
    while d < n:
        if v < d and v + d < n:
            dist.send(tensor.contiguous(), (v + d + src) % n)
        elif d <= v < 2 * d:
            buffer = torch.empty_like(tensor, memory_format=torch.contiguous_format)  # recv needs contiguous
            dist.recv(buffer, (v - d + src) % n)
            tensor.copy_(buffer)
        d *= 2
    return tensor
    # END SOLUTION


def all_gather_p2p(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Return the list of every rank's `tensor`, in rank order, built from point-to-point messages.

    The same as `out = [torch.empty_like(tensor) for _ in range(n)]; dist.all_gather(out, tensor)`: a
    list of n new contiguous tensors with `tensor`'s shape and dtype, each in its own memory (entry `rank`
    too is a copy, never `tensor` itself); `tensor` is left unchanged and may be non-contiguous.
    Every rank sends its tensor directly to every other rank and receives theirs, one message each way per
    pair (not passed on around a ring in n - 1 dependent steps). Post all the sends and receives together
    with `dist.batch_isend_irecv` (PyTorch's version of NCCL's group calls), so no rank waits for another to
    finish first, then wait on every request.
    """
    # BEGIN SOLUTION: one dist.P2POp(dist.isend, ...) and one dist.P2POp(dist.irecv, ...) per other rank; batch_isend_irecv(ops) returns requests to wait() on
    rank, n = dist.get_rank(), dist.get_world_size()
    out = [torch.empty_like(tensor, memory_format=torch.contiguous_format) for _ in range(n)]
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

    collective is one of 'all_reduce', 'reduce_scatter', 'all_gather', 'all_to_all', 'broadcast', 'reduce'.
    The factor is the fraction of the size S (as nccl-tests counts it, notebook 04 section 6) that crosses
    the busiest rank's link in the ring algorithm of that collective: for all_reduce you counted it in
    section 5 (each rank sends 2(n-1) chunks of S/n); derive the others the same way (reduce_scatter and
    all_gather are the two halves of that ring; in all_to_all each rank keeps 1/n of its data; a pipelined
    broadcast or reduce passes the whole tensor over every link once). Return a float.
    Raise ValueError for any other name or world_size < 1 (for every collective).
    """
    # BEGIN SOLUTION: a dict from name to factor: count the bytes each rank sends in the ring version, divided by S
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
    algbw = S / seconds; busbw = algbw * bus_bandwidth_factor(collective, world_size); return the tuple
    (algbw, busbw) of two floats. Raise ValueError if seconds <= 0 or size_bytes < 0, and, as
    bus_bandwidth_factor does, for an unknown collective or world_size < 1 (whatever the size, 0 included).
    """
    # BEGIN SOLUTION: divide by 1e9 for GB/s; reuse bus_bandwidth_factor
    if seconds <= 0 or size_bytes < 0:
        raise ValueError(f"need seconds > 0 and size_bytes >= 0, got seconds={seconds}, size_bytes={size_bytes}")
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * bus_bandwidth_factor(collective, world_size)
    # END SOLUTION


def tree_all_reduce_crossover(world_size: int, alpha: float, beta: float) -> float:
    """The size S in bytes below which a tree all-reduce beats the ring, under the alpha-beta model.

    A message of m bytes costs alpha + m * beta seconds (notebook 04, section 5). Compare two all-reduces of
    S bytes over n = world_size ranks:
    - the ring you built in ring_all_reduce (count its steps and the bytes of each message; take every
      chunk to be S/n bytes);
    - a tree: reduce to one rank along the binomial tree of tree_broadcast run backwards (each rank adds
      what it receives to its own tensor before passing it on), then tree_broadcast the sum. Every message
      is the whole tensor, and a round costs one message's time.
    Return the S at which both take the same time (the tree is faster for smaller S), a float, or 0.0 if the
    tree is never faster. Raise ValueError if world_size < 1, alpha < 0 or beta <= 0, before anything else
    (also where the answer would be 0.0 anyway).
    """
    # BEGIN SOLUTION: write each algorithm's time as rounds * (alpha + bytes per message * beta); both are straight lines in S: where do they cross?
    if world_size < 1 or alpha < 0 or beta <= 0:
        raise ValueError(f"need world_size >= 1, alpha >= 0 and beta > 0, got {world_size}, {alpha}, {beta}")
    n = world_size
    rounds = math.ceil(math.log2(n)) if n > 1 else 0  # of each tree half
    # 2(n-1) alpha + 2(n-1)/n S beta = 2 rounds (alpha + S beta)  <=>  S = (n-1-rounds) alpha / ((rounds - (n-1)/n) beta)
    latency_saved = (n - 1 - rounds) * alpha
    bandwidth_lost = (rounds - (n - 1) / n) * beta
    if latency_saved <= 0 or bandwidth_lost <= 0:
        return 0.0
    return latency_saved / bandwidth_lost
    # END SOLUTION


def all_reduce_perf_bandwidths(log: str) -> dict:
    """Read an nccl-tests `all_reduce_perf` log and compute its algorithm and bus bandwidths yourself.

    `log` is the text all_reduce_perf prints (notebook 04, section 6 shows two real ones), by any version of
    nccl-tests: older ones print no root column (and an error column where newer ones print #wrong), so
    find the columns from the header line, not by fixed positions. Return
    {"ranks": n, "rows": [[size_bytes, time_us, algbw, busbw], ...]}: n (an int) is the number of GPUs taking part,
    counted from the log's list of devices (one process may drive several GPUs: see nGpus); one row per
    message size, in the order printed, with size_bytes an int, the out-of-place time in microseconds (a
    float); algbw and busbw floats in GB/s (10**9 bytes per second), computed from the size, that time and n
    as nccl-tests defines them, not copied from the log's columns (printed rounded to 0.01: 0.00 for small
    sizes). Lines that are not results (comments, warnings) are skipped. Raise ValueError if
    the log has no result rows or no device list.
    """
    # BEGIN SOLUTION: count the GPUs in the device list; find the out-of-place time column from the header line; then section 6's definitions (mind the units)
    ranks = sum(1 for line in log.splitlines() if re.match(r"#\s*Rank\s+\d+", line))
    header = next((line.lstrip("#").split() for line in log.splitlines()
                   if line.startswith("#") and "size" in line.split() and "time" in line.split()), None)
    if not ranks or header is None:
        raise ValueError("no device list or no column header: is this all_reduce_perf's output?")
    size_at, time_at = header.index("size"), header.index("time")  # the first "time" is out-of-place
    rows = []
    for line in log.splitlines():
        fields = line.split()
        if line.startswith("#") or len(fields) <= time_at or not fields[size_at].isdigit():
            continue
        size, micros = int(fields[size_at]), float(fields[time_at])
        algbw = size / (micros * 1e-6) / 1e9
        rows.append([size, micros, algbw, algbw * bus_bandwidth_factor("all_reduce", ranks)])
    if not rows:
        raise ValueError("no result rows found in the log")
    return {"ranks": ranks, "rows": rows}
    # END SOLUTION
