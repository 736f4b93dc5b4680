# Exercise file: replace each `raise NotImplementedError(...)` with your code,
# then run `check("ex02")` in the notebook (or `python3 course.py check ex02`).
"""Exercise 02: streams and asynchronous execution. Time device work, model a copy/compute pipeline, prefetch
batches on a side stream, and take a hidden synchronisation out of a loop.

Notebook: notebooks/02_streams_and_async.ipynb

On any machine the tests run the CUDA parts of your code against a *simulated* GPU: a model of one or more
devices, their streams, events, copies and PyTorch's caching allocator that replaces torch.cuda and Tensor.to in
the process that runs your code, while the test runs. It checks the order in which your code makes things
happen, and the time its schedule takes in simulated seconds. On a machine with a GPU, three more tests run your
code on the real device.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn


def time_device(fn: Callable[[], Any], device: torch.device | str, *, warmup: int = 3,
                repeat: int = 10) -> list[float]:
    """Time `fn()` on `device`: return `repeat` durations in seconds (a list of floats), one per call, after
    `warmup` untimed calls.

    `fn` queues work on `device` and may return before the work is done (on a GPU it always does).
    - On a CUDA device, time each call with a pair of CUDA events (torch.cuda.Event(enable_timing=True))
      recorded around it on `device`'s current stream, and read them only once the GPU has passed them
      (torch.cuda.synchronize(device) or Event.synchronize()). Remember the unit that Event.elapsed_time returns.
      `device` need not be the current device ("cuda:1" while cuda:0 is current): Event.record() and
      torch.cuda.synchronize() without arguments concern the *current* device, so select `device` around the
      timing (with torch.cuda.device(device): ...); "cuda" without an index means the current device. The
      current device and stream are the same after the call as before.
      The tests run this path on a simulated GPU with several devices that models these torch.cuda calls (and on
      a real one if present).
    - On any other device (cpu, meta...), the work is done when fn() returns: use time.perf_counter().
    Call fn exactly warmup + repeat times. Raise TypeError if fn is not callable (with a message that names fn and
    says what to pass, not Python's own "'int' object is not callable") and ValueError if warmup < 0 or repeat < 1.
    """
    raise NotImplementedError("what is still in the GPU's queue when fn() returns, when may an event be read, and in which unit is elapsed_time?")


def pipeline_time(n_batches: int, copy: float, compute: float, *, overlapped: bool) -> float:
    """Total time to copy and then compute on `n_batches` batches, each copy taking `copy` and each compute
    `compute` (any time unit; the result, a float, is in the same unit).

    - overlapped=False: one queue does everything in turn: copy 0, compute 0, copy 1, compute 1, ...
    - overlapped=True: copies run one after another on their own engine, ahead of the computes; compute i
      starts when copy i is done and compute i-1 is done. This is the schedule the lesson draws.
    Zero batches take no time. Use a formula, not a loop: the tests ask for a billion batches.
    Raise ValueError if n_batches < 0 or a time is negative.
    """
    raise NotImplementedError('draw the overlapped schedule for 3 batches: what can the first copy overlap with? and the last compute?')


class Prefetcher:
    """Iterate over `loader`'s batches already moved to `device`, each one's copy started one batch ahead.

    Contract, on every device:
    - yields exactly the batches `loader` yields, in the same order, each with every tensor moved to `device`
      (map_tensors below: the same structure, container types included; any other value, None included, is
      handed out as it is, and a batch may itself be None or a plain value); the loader's batches themselves
      are left unchanged;
    - stays exactly one batch ahead: when the caller receives batch i, the loader has already produced batch
      i+1 (if there is one) and not yet batch i+2; nothing is taken from the loader before iteration starts;
    - each iter(prefetcher) is a new pass over `loader`, which may give other batches than the last pass did;
      len(prefetcher) == len(loader).

    On a CUDA device the copies must overlap the caller's work, and be safe:
    - `device` may be any CUDA device, not only the current one ("cuda:1" while cuda:0 is current): the batches
      go to that device, on a side stream of that device (torch.cuda.Stream(device));
    - copy on a side stream of your own, from pinned memory (pin a batch only if the loader has not: pinning
      costs host time), without making the host wait;
    - the caller's stream must not read batch i before its copy is done, but its work on batch i must not
      wait for the copy of batch i+1. The caller's stream is `device`'s *current* stream when batch i is handed
      out, which need not be its default stream (the caller may iterate inside `with torch.cuda.stream(s):`);
    - the memory of a batch handed out must not be reused while the caller's stream may still read it;
    - handing out a batch never makes the host wait for the GPU.
    Use these torch.cuda calls (the tests replace exactly these with a simulated GPU; other ways to make device
    tensors, such as copy_ into a preallocated one, and the torch.Stream spellings are not simulated):
    torch.cuda.Stream(device), with torch.cuda.stream(s), torch.cuda.current_stream(device),
    Tensor.is_pinned(), Tensor.pin_memory(), Tensor.to(device, non_blocking=True), Stream.wait_stream(other)
    (or torch.cuda.Event(), Event.record(stream), Stream.wait_event(event)), Tensor.record_stream(stream).
    On other devices (cpu, meta...) a plain .to(device) does; there is nothing to overlap with.
    """

    def __init__(self, loader: Iterable, device: torch.device | str):
        raise NotImplementedError('keep the loader and the device; nothing else happens until iteration starts')

    def __len__(self) -> int:
        raise NotImplementedError('as long as the loader')

    def __iter__(self):
        raise NotImplementedError("keep one batch in flight; before handing one out, ask: which copies may the caller's stream wait for, and when?")


def _next_or_none(iterator) -> tuple | None:
    """(the next item,) or None at the end: a batch may itself be None or falsy."""
    for item in iterator:
        return (item,)
    return None


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`batch` with every tensor t in it replaced by fn(t), called once per tensor, as exercise 01's to_device did
    for fn = lambda t: t.to(device) (reuse yours).

    The structure is kept exactly: tuples, lists, namedtuples and mappings (dict, OrderedDict, defaultdict with
    its default_factory, UserDict...) come back as the same types, with the same keys in the same order, nested
    to any depth; every other value (None, numbers, strings, objects) comes back as the very same object; a
    tensor alone is just fn(tensor). The containers returned are new ones: `batch` itself is left unchanged.
    """
    raise NotImplementedError("recurse as in exercise 01's to_device, calling fn on each tensor")


def mean_loss(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """The mean over `batches` of the per-batch cross-entropy loss of `model`, as a Python float.

    `batches` is a list of (inputs, class_indices) pairs already on the model's device, which need not be the
    current device (the model may live on cuda:1 while cuda:0 is current). This version gives
    the right answer but, on a GPU, makes the host wait for the device at every batch:

        total = 0.0
        for x, y in batches:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            total += loss.item()              # the host waits here for the GPU, every batch
        return total / len(batches)

    Write it so that the host reads from the device once, at the very end: keep the running total on the
    device (the batches' device) and turn it into a Python float with a single .item() (or float()). Not with
    .to("cpu", non_blocking=True): that copy returns before its values have arrived. The tests count every place
    where the host reads a tensor's value (item, float, int, bool, tolist, numpy, cpu, printing).
    Nothing here needs gradients: compute under torch.no_grad(). Raise ValueError if `batches` is empty.
    """
    raise NotImplementedError('which call in the loop makes the host wait, and where could the running total live instead?')
