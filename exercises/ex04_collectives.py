# Exercise file: replace each `raise NotImplementedError(...)` with your code,
# then run `check("ex04")` in the notebook (or `python3 course.py check ex04`).
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
    raise NotImplementedError('follow one chunk through the picture: which chunk does a rank send right after it received one? isend() to the right, recv() from the left, then wait() on the send (blocking sends on every rank at once deadlock); skip empty chunks on both sides')


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
    raise NotImplementedError('number the ranks relative to src, v = (rank - src) % n; after each round twice as many hold the data: who sends to whom so that they do?')


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
    raise NotImplementedError('one dist.P2POp(dist.isend, ...) and one dist.P2POp(dist.irecv, ...) per other rank; batch_isend_irecv(ops) returns requests to wait() on')


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
    raise NotImplementedError('a dict from name to factor: count the bytes each rank sends in the ring version, divided by S')


def bandwidths(collective: str, size_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """Algorithm and bus bandwidth in GB/s (10**9 bytes per second), as nccl-tests reports them.

    size_bytes is S in nccl-tests: the size of the whole array (for all_reduce, one rank's tensor;
    for all_gather, the gathered output; for reduce_scatter, the input before scattering).
    algbw = S / seconds; busbw = algbw * bus_bandwidth_factor(collective, world_size); return the tuple
    (algbw, busbw) of two floats. Raise ValueError if seconds <= 0 or size_bytes < 0, and, as
    bus_bandwidth_factor does, for an unknown collective or world_size < 1 (whatever the size, 0 included).
    """
    raise NotImplementedError('divide by 1e9 for GB/s; reuse bus_bandwidth_factor')


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
    raise NotImplementedError("write each algorithm's time as rounds * (alpha + bytes per message * beta); both are straight lines in S: where do they cross?")


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
    raise NotImplementedError("count the GPUs in the device list; find the out-of-place time column from the header line; then section 6's definitions (mind the units)")
