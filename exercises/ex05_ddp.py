# Exercise file: replace each `raise NotImplementedError(...)` with your code,
# then run `check("ex05")` in the notebook (or `python3 course.py check ex05`).
"""Exercise 05: DistributedDataParallel by hand. Buckets, overlapped all-reduces, the sampler, accumulation, a comm hook.

Notebook: notebooks/05_ddp.ipynb

The distributed parts run inside ranks started by `course_lib.dist.launch` (or the tests' runner): a process
group is already initialised, every rank holds the same model class and calls your code in the same order.
The tests run 1, 2 and 3 gloo ranks on the CPU and compare with torch's own code on the same data: a single
process training on the union of every rank's batch, torch.nn.parallel.DistributedDataParallel, its
DistributedSampler, its bucketing function and its fp16 compression hook. They also watch HOW your code talks:
every all-reduce is logged (its size, dtype, whether it was asynchronous, when it was waited on), and a hook
on the model's first layer marks when backward reaches it, so an all-reduce that only starts after backward
has finished shows, however right its numbers are.
"""

import contextlib
import itertools
import math
import numbers
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

MiB = 2**20  # bytes: DDP's bucket_cap_mb counts mebibytes


def bucket_assignment(sizes_in_bytes: Sequence[int], bucket_cap_mb: float = 25.0,
                      first_bucket_mb: float = 1.0) -> list[list[int]]:
    """Group parameters into gradient buckets the way DistributedDataParallel does; return the lists of indices.

    `sizes_in_bytes[i]` is the gradient size of parameter i (p.numel() * p.element_size()), in registration
    order, i.e. the order of `model.parameters()`. Backward produces gradients roughly in REVERSE of that order
    (the last layer's first), so DDP walks the parameters from the last one to the first, adding each to the
    open bucket; as soon as the open bucket holds AT LEAST its limit, it is closed (so a bucket may exceed its
    limit: a huge parameter closes its bucket by itself) and the next one opens. The first bucket's limit is
    `first_bucket_mb` (small, so the first all-reduce starts early), every later bucket's is `bucket_cap_mb`;
    a limit in MiB is int(mb * 2**20) bytes (fractions of a MiB allowed). Whatever is left when the walk ends
    is the last bucket. A limit of 0 closes every bucket at once: one parameter per bucket.

    Return a new list of buckets in the order they fill (the order their all-reduces start), each a list of
    parameter indices (Python ints) in the order they were added; every index appears exactly once; no
    parameters, no buckets. `sizes_in_bytes` (a list or a tuple) is left unchanged.
    A size is a count of bytes, so the course's rule for counts applies: any whole number is a size, numpy's
    integers too (`np.prod(p.shape) * 4` is a numpy.int64; its dtype may be narrow, e.g. numpy.uint16, so add the
    sizes up as Python ints, operator.index(size), or the running total wraps around), and so is an integral
    float such as 4096.0 or 4e6 (converted with int()); a bool (True is an int to isinstance), a fractional
    float such as 4096.5, nan, inf or anything else is not a size. A cap is any finite real number, numpy's too.
    Example: bucket_assignment([400, 300, 200, 100], bucket_cap_mb=500 / 2**20, first_bucket_mb=250 / 2**20)
             -> [[3, 2], [1, 0]]   (100 + 200 >= 250 closes the first bucket; 300 + 400 >= 500 the second)
    This is the rule of torch's `dist._compute_bucket_assignment_by_size` (torch/csrc/distributed/c10d/
    reducer.cpp), which DDP applies, in the order gradients became ready, when it rebuilds its buckets after
    the first iteration. (DDP also keeps dtypes and devices in separate buckets; here every gradient has one.)
    Raise ValueError, with a message that names the argument to fix and says what to pass, if a size is
    negative or not a whole number (a bool, 4096.5), or if a cap is negative or not a finite number.
    """
    raise NotImplementedError("check and convert first (numbers.Integral and operator.index accept numpy's integers; a bool is an int too; an integral float is a whole number, a fractional one is not), then walk i from len - 1 down to 0 with a running total for the open bucket; which limit applies to the bucket being filled, and when does it switch?")


class _Bucket:
    """One bucket of MiniDDP: its parameters, where each one's gradient sits in the flat buffer, and its state."""

    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.offsets = list(itertools.accumulate((p.numel() for p in params), initial=0))[:-1]  # elements
        self.buffer = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        self.ready = 0  # how many of its parameters have their gradient copied in, this iteration
        self.work = None  # the all-reduce in flight (what dist.all_reduce(..., async_op=True) returned)


class MiniDDP(nn.Module):
    """DistributedDataParallel in a page: broadcast at construction, bucketed all-reduces overlapped with backward.

    `MiniDDP(module, bucket_cap_mb)` wraps `module` (kept, the very same object, as `self.module`; `forward`
    calls it). Use it like DDP, with one more call in the training loop:

        model = MiniDDP(net, bucket_cap_mb=25)
        for inputs, targets in batches:          # this rank's share of each global batch
            optimizer.zero_grad()
            loss_fn(model(inputs), targets).backward()
            model.finish_gradient_synchronization()
            optimizer.step()                     # every rank takes the same step

    The constructor (every rank calls it, a collective):
    - makes every rank start from rank 0's model: `dist.broadcast` from rank 0 of every parameter (frozen ones
      too) and every buffer of `module.buffers()` (BatchNorm's running statistics, any registered buffer, a
      non-persistent one too: state_dict() leaves those out, DDP does not), in place;
    - puts the parameters that require a gradient into buckets with your `bucket_assignment`, over
      `module.parameters()` (which lists a tied weight once), frozen ones left out, with `bucket_cap_mb` for
      every bucket and min(1.0, bucket_cap_mb) MiB for the first (DDP's default: 1 MiB, then 25); each bucket
      gets one flat buffer (zeros, the parameters' dtype and device) holding its gradients side by side;
    - registers a hook on each such parameter with `param.register_post_accumulate_grad_hook`, which autograd
      calls as soon as that parameter's .grad is complete during backward.
    The hook writes the gradient, divided by the world size, into its place in its bucket's buffer; when every
    parameter of a bucket has arrived, the bucket's all-reduce STARTS (a sum of the ranks' shares: the mean):
    `dist.all_reduce(buffer, async_op=True)`, which returns at once, so the sum travels while backward goes on
    computing the earlier layers' gradients. Buckets are started in bucket order, the order bucket_assignment
    returns them: bucket 0, then 1, ... (all ranks must issue their collectives in the same order; when forward
    visits the layers in another order than they were registered, gradients become ready in another order, and
    a bucket that fills early waits for the ones before it: it starts as soon as every earlier bucket has).
    `finish_gradient_synchronization()`, after backward: wait for every bucket's all-reduce, copy the averaged
    values back into each parameter's .grad, and reset the buckets for the next iteration. Afterwards every
    rank's .grad is the mean of the ranks' gradients, what one process gets from the mean loss over the union of
    the ranks' equally sized batches. bucket_cap_mb=0 gives one bucket, so one all-reduce, per parameter.

    Hooks outlive the wrapper that registered them: they belong to the parameters. So a MiniDDP can be closed,
    and a module wrapped again never keeps the old hooks (a notebook cell `model = MiniDDP(net)` run twice would
    otherwise start two all-reduces per bucket, one that nobody waits for):
    - `close()` waits for any all-reduce still in flight, then removes every hook this wrapper registered (keep
      the handles `register_post_accumulate_grad_hook` returns, and call their `.remove()`); afterwards a
      backward through the module is purely local. Closing twice is harmless.
    - `with MiniDDP(net) as model:` returns the wrapper itself and closes it when the block ends.
    - The constructor closes the MiniDDP that wrapped this very module before, if one is still open: remember
      the current wrapper on the module (a `weakref.ref(self)` in an attribute, so the module does not keep the
      wrapper alive), and check that the wrapper found there has this module as its `.module` (a deep copy of
      the module carries the attribute along).

    Every trainable parameter must get a gradient in every backward (a layer called twice, or a weight tied to
    two layers, still gets one gradient: the hook fires once, after both uses are summed), and there is one
    backward per finish_gradient_synchronization() (no find_unused_parameters, no accumulation without
    syncing). A parameter that gets no gradient is an error, never skipped in silence: its bucket, and so every
    later one, never starts, and finish_gradient_synchronization() raises RuntimeError (after waiting for the
    buckets that did start, so no all-reduce is left in flight), as torch's DDP without find_unused_parameters
    raises at the next forward; returning as if synchronised would let each rank step on its own gradients. The
    trainable parameters share one dtype and device. Only the constructor broadcasts buffers (DDP also does
    it at every forward). Do not use torch's DistributedDataParallel inside: the tests switch it off.
    Raise ValueError if bucket_cap_mb is negative (numpy's numbers are numbers too).
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0):
        super().__init__()
        self.module = module
        raise NotImplementedError("close the module's previous MiniDDP if one is still open; broadcast (under torch.no_grad()) every tensor of module.parameters() and module.buffers() from rank 0; then buckets from bucket_assignment over the trainable parameters, a flat buffer each (the _Bucket class above), and one post-accumulate-grad hook per parameter that knows its bucket and offset (keep the handles for close()); finally remember this wrapper on the module")

    def _gradient_ready(self, bucket_index: int, offset: int, param: nn.Parameter) -> None:
        """The hook: `param.grad` is complete; copy it into its bucket, and start the buckets that are full."""
        raise NotImplementedError('write param.grad (flattened) divided by the world size into buffer[offset:offset + numel] (torch.div(..., out=...) copies and divides in one pass); count it; while the next bucket to start is full, start its all_reduce with async_op=True (never wait here)')

    def finish_gradient_synchronization(self) -> None:
        """After backward, before optimizer.step(): wait for every all-reduce, copy the means into each .grad.

        Leaves the buckets ready for the next iteration. Raises RuntimeError if a bucket never started (some
        trainable parameter got no gradient in this backward).
        """
        raise NotImplementedError("wait() on each bucket's work, copy each slice back into its param.grad (view it with the parameter's shape), then reset every bucket's count and work, and which bucket starts next")

    def close(self) -> None:
        """Wait for any all-reduce in flight, then remove this wrapper's hooks: backward becomes local again."""
        raise NotImplementedError("wait() on every bucket's work that is not None (the other ranks started it too); then .remove() every hook handle and forget it (pop them off the list), so a second close() removes nothing")

    def __enter__(self) -> "MiniDDP":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


def sampler_indices(dataset_len: int, num_replicas: int, rank: int, *, shuffle: bool = True, seed: int = 0,
                    epoch: int = 0, drop_last: bool = False) -> list[int]:
    """The dataset indices `torch.utils.data.DistributedSampler` gives `rank` of `num_replicas` in epoch `epoch`.

    The same list as `DistributedSampler(dataset, num_replicas, rank, shuffle=shuffle, seed=seed,
    drop_last=drop_last)` after `set_epoch(epoch)`, for a dataset of `dataset_len` items, computed without it:
    1. the order: with shuffle, `torch.randperm(dataset_len, generator=g).tolist()` for a torch.Generator
       seeded with seed + epoch (so every rank draws the same permutation, and a new one each epoch); without
       shuffle, 0, 1, ..., dataset_len - 1;
    2. an equal share for every rank: without drop_last, each rank gets ceil(dataset_len / num_replicas)
       indices, the list padded to num_replicas times that by repeating it from its start (as often as needed:
       a dataset shorter than the padding repeats whole); with drop_last, each gets
       floor(dataset_len / num_replicas), the tail cut off;
    3. interleaved, not in blocks: rank r takes positions r, r + num_replicas, r + 2 num_replicas, ...
    Return a list of Python ints (empty for an empty dataset). Raise ValueError, saying what to pass, if
    num_replicas < 1, rank is not in 0 .. num_replicas - 1, or dataset_len < 0.
    """
    raise NotImplementedError('count samples per rank first (ceil, or floor with drop_last), then order, pad or cut to num_replicas * that, and take every num_replicas-th index starting at rank')


def train_with_accumulation(ddp_model: nn.parallel.DistributedDataParallel, optimizer: torch.optim.Optimizer,
                            loss_fn: Callable[[Any, Any], torch.Tensor], micro_batches: Sequence[tuple[Any, Any]],
                            accumulation_steps: int) -> list[float]:
    """Train `ddp_model` on this rank's micro-batches, one optimizer step per `accumulation_steps` of them.

    `ddp_model` is a torch.nn.parallel.DistributedDataParallel; `micro_batches` is this rank's list of
    (inputs, targets) pairs (`ddp_model(inputs)`, then `loss_fn(outputs, targets)`, a mean over the micro-batch).
    Every rank passes the same number of micro-batches (a rank with fewer would leave the others waiting in an
    all-reduce). Cut the list into windows of `accumulation_steps` consecutive micro-batches; per window:
    - zero the gradients, then run forward and backward on each micro-batch with its loss divided by the
      window's length, so the accumulated .grad is the MEAN over the window's micro-batches (and, after DDP's
      average, over every rank's: the gradient one process gets on the window's big batch of all ranks' data);
    - run every micro-batch but the window's last inside `with ddp_model.no_sync():` (forward and backward),
      so DDP only accumulates locally; the last one's backward then all-reduces the accumulated gradients:
      ONE all-reduce per optimizer step, not one per micro-batch (never flip DDP's private flags instead);
    - take one optimizer step (call only the optimizer's zero_grad() and step()).
    If len(micro_batches) is not a multiple of accumulation_steps, the last, shorter window still gets its
    step, its losses divided by its own length: the tail's data is used, not dropped, and its gradient is
    still a mean (what a DataLoader with drop_last=False gives at the end of an epoch).
    Return one Python float per optimizer step: the mean of the (undivided) losses of that window's micro-batches
    on THIS rank (no extra communication; all-reduce it yourself if you want the global mean for logging).
    `accumulation_steps` is a count, so the course's rule for counts applies: an int (numpy's integers too) or an
    integral float such as 4.0 (converted with int()). Raise ValueError, naming accumulation_steps and saying what
    to pass, if it is less than 1 or not a whole number (a bool, 1.5, nan, inf, a string).
    """
    raise NotImplementedError("check and convert accumulation_steps first (like bucket_assignment's sizes); for each window: zero_grad(); for each micro-batch, no_sync() unless it is the window's last (contextlib.nullcontext() otherwise), backward of loss / len(window); then step()")


def fp16_compress_hook(process_group: dist.ProcessGroup | None,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook that all-reduces each bucket in float16: half the bytes on the wire.

    Register it with `ddp_model.register_comm_hook(process_group, fp16_compress_hook)`: DDP then calls it for each
    bucket whose gradients are ready, instead of its own all-reduce, and waits on the future it returns before
    copying the bucket back into the parameters' .grad. It must:
    - use `process_group`, or the default group (`dist.group.WORLD`) when it is None, and its size;
    - take the bucket's flat gradients, `bucket.buffer()` (float32), cast a copy to torch.float16 and divide that
      by the group's size BEFORE the all-reduce (a sum of float16 gradients can overflow: 65504 is the largest).
      Cast first, then divide, as torch's hook does: so a gradient already above 65504 is inf before any
      division, and the division pushes small gradients toward float16's underflow (notebook 05, section 8);
    - start `dist.all_reduce(compressed, group=..., async_op=True)` and return at once, without waiting: return
      `work.get_future().then(decompress)`, where `decompress(fut)` copies `fut.value()[0]` (the averaged float16
      tensor) back into the bucket's float32 buffer and returns that buffer. So once the future is done, its
      value is the bucket's buffer, float32 (not the float16 sum), and the buffer holds the group's MEAN (DDP
      copies the future's value into .grad, which would hide a float16 value or an un-averaged buffer; a caller
      of the hook sees both). Only the ranks of `process_group` call the hook (DDP on a subgroup runs on its
      ranks only), so divide by that group's size, not the default group's.
    What torch's own `torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook` computes;
    the tests compare with it. Keep the signature's annotations as they are: register_comm_hook checks them
    (which is also why this file has no `from __future__ import annotations`: it turns them into strings,
    and DDP refuses the hook).
    """
    raise NotImplementedError('group = process_group or dist.group.WORLD; compressed = buffer.to(torch.float16).div_(group.size()); all_reduce it asynchronously and chain .then(...) on work.get_future() to copy the result back into the buffer')
