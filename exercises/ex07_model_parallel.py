# Exercise file: replace each `raise NotImplementedError(...)` with your code,
# then run `check("ex07")` in the notebook (or `python3 course.py check ex07`).
"""Exercise 07: Model parallelism. The pipeline bubble, GPipe and 1F1B schedules, balancing stages, Megatron's linears.

Notebook: notebooks/07_model_parallel.ipynb

Five pieces, from arithmetic to ranks: the idle fraction of a GPipe pipeline; the schedule of a pipeline, op by
op, for GPipe (all forwards, then all backwards) and 1F1B (one forward, one backward in the steady state); a
split of a model's layers into contiguous stages that makes the slowest stage as fast as it can be; and the
two halves of Megatron-LM's tensor parallelism, a linear layer split by its output rows (ColumnParallelLinear)
and one split by its input columns (RowParallelLinear), which together run a transformer's MLP with one
all-reduce in forward and one in backward.
Everything runs on the CPU. The tests compare with references computed in the test process: a time-stepped
simulation of each schedule, a brute force over every split of the layers, and torch's nn.Linear on the whole
weight in one process. They run the tensor-parallel layers in 1, 2, 3 and 4 gloo ranks (on subgroups too) and log
every collective your code starts (its kind, size, reduce op and group); while your code runs, torch's pipelining
schedules, torch.distributed.tensor.parallel, torch's functional collectives and the lesson's own pipeline
helpers in course_lib.parallel are switched off, so each piece has to be built, not borrowed.
"""

import math
import numbers
import operator
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

KINDS = ("gpipe", "1f1b")  # the schedules pipeline_schedule knows


def _check_count(name: str, value, what: str) -> int:
    """value as a Python int, or a ValueError naming the argument and saying what to pass.

    A count is a whole number, 1 or more: an int (numpy's ints too) or an integral float such as 4.0 (as a
    learner types 7.5e9); not a bool (True is not 1 stage), not a fractional float (4.5), nan or inf, not a str.
    """
    raise NotImplementedError("bool is a subclass of int: refuse it first, and anything not a real number; an Integral (numpy's too) through operator.index, another Real through int() if it is integral (float(value).is_integer(): False for 4.5, nan and inf); then at least 1")


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The fraction of a GPipe pipeline's time slots in which a stage sits idle: its bubble.

    A model cut into p = `stages` stages (one per device) runs a batch as m = `micro_batches` micro-batches; a
    forward and a backward each take one time unit on every stage. Stage s can start micro-batch 0's forward
    only at time s, and the last backward reaches stage 0 only p - 1 units after it leaves the last stage, so
    the whole step takes 2(m + p - 1) units, of which each stage is busy 2m: the idle fraction is
    (p - 1) / (m + p - 1). One stage has no bubble (0.0); more micro-batches shrink it (GPipe's advice:
    m >= 4p keeps it under 20 %).
    Return it as a Python float. stages and micro_batches are counts: whole numbers, 1 or more, given as ints
    (numpy's too) or as integral floats (4.0 is 4 stages). Raise ValueError, naming the argument and saying what
    to pass, for anything else: a fractional float (4.5), nan or inf, a str, and True or False (bool is a subclass
    of int, but True is not a number of stages).
    """
    raise NotImplementedError('check both arguments first and take them as ints (the helper _check_count above); then the idle slots over all slots, p(2(m+p-1)) in all of which 2mp are busy')


def pipeline_schedule(stages: int, micro_batches: int, kind: str = "1f1b") -> list[tuple[int, int, int, str]]:
    """Which stage runs which micro-batch's forward or backward at each time step, for GPipe or 1F1B.

    A pipeline of p = `stages` stages runs m = `micro_batches` micro-batches; every op, the forward F or the
    backward B of micro-batch j on stage s, takes one time step (0, 1, 2, ...). The dependencies:
    - F(s, j) only after F(s - 1, j) (stage s needs the previous stage's activations), at a later step;
    - B(p - 1, j) only after F(p - 1, j) (the loss is on the last stage);
    - B(s, j) only after B(s + 1, j) (the gradient comes back from the next stage).
    A stage runs at most one op per time step. Each stage works through its own list of ops, in order:
    - "gpipe": F(s, 0), F(s, 1), ..., F(s, m - 1), then B(s, 0), B(s, 1), ..., B(s, m - 1) (all forwards, then all
      backwards, in micro-batch order, as torch's ScheduleGPipe);
    - "1f1b": with w = min(p - s - 1, m) warm-up forwards F(s, 0) ... F(s, w - 1); then, for i = 0, ..., m - w - 1,
      one forward and one backward, F(s, w + i), B(s, i); then the w remaining backwards B(s, m - w) ...
      B(s, m - 1) (PipeDream-Flush of Narayanan et al. 2021, the order of torch's Schedule1F1B: the last stage
      goes F0 B0 F1 B1 ..., stage s never holds more than p - s micro-batches' activations).
    Each op runs as early as it can: at the first step after the previous op of its list, and after the op it
    depends on (so a stage sits idle while its next op waits). Both schedules then take 2(m + p - 1) steps, with
    the same bubble as GPipe's; 1F1B only frees activations sooner.
    Return every op as a tuple (time_step, stage, micro_batch, "F" or "B") of Python ints and a str, in a new list
    sorted by (time_step, stage): 2 m p tuples. For p = 2, m = 2, "gpipe":
        [(0, 0, 0, "F"), (1, 0, 1, "F"), (1, 1, 0, "F"), (2, 1, 1, "F"), (3, 1, 0, "B"), (4, 0, 0, "B"),
         (4, 1, 1, "B"), (5, 0, 1, "B")]
    stages and micro_batches are counts, as in bubble_fraction: ints (numpy's too) or integral floats such as 4.0,
    1 or more; the ops hold Python ints whatever was passed. kind is "gpipe" or "1f1b" in any case: "GPipe" and
    "1F1B", as the papers write them, are the same kinds. Raise ValueError, naming the argument, for any other
    count (a fractional float, nan, a str, True or False) and any other kind (not a str, or another name such as
    "interleaved": the message lists both kinds). Do not use torch.distributed.pipelining's schedules (or the
    lesson's course_lib.parallel helpers): the tests switch them off.
    """
    raise NotImplementedError('check the counts and take them as ints (_check_count), and the kind, lower-cased; build each stage\'s list of ("F"/"B", micro-batch); then place ops one by one: an op\'s step is max(the step after its stage\'s previous op, the step after the op it depends on), looping over the stages until every list is placed')


def partition(costs: Sequence[float], stages: int) -> list[list[int]]:
    """Split layers 0 .. n - 1 into `stages` contiguous stages so that the costliest stage costs as little as possible.

    `costs[i]` is layer i's cost (its time, or its parameters' bytes); a stage's cost is the sum of its layers'.
    A pipeline runs at the pace of its slowest stage, so choose the stages' boundaries to minimise the largest
    stage cost (the linear partition problem): dynamic programming over (stages used, layers covered), where
    best(k, i), the smallest largest cost of layers 0 .. i - 1 in k stages, is the min over the last stage's
    start j of max(best(k - 1, j), cost of layers j .. i - 1); or a binary search on the answer with a greedy
    check. Every stage gets at least one layer, in order, each layer exactly once.
    Return a new list of `stages` lists of layer indices (Python ints), e.g.
        partition([4, 1, 1, 1, 1, 4], 3) -> [[0], [1, 2, 3, 4], [5]]     (stage costs 4, 4, 4)
    When several splits reach the same largest cost, any of them is right. `costs` (a list or a tuple) is left
    unchanged. Costs may be as large as floats go (up to about 1.8e308): their sums must not overflow to inf,
    or every split looks equally bad (inf) and a stage can come out empty; 1e308 + 1e308 is inf, and inf - inf
    is nan. Raise ValueError, naming the argument and saying what to pass, unless costs is a non-empty list or
    tuple of finite numbers (int or float, not bool, an int no larger than a float can hold), each 0 or more,
    and stages a count from 1 to len(costs): an int (numpy's too) or an integral float such as 2.0, not a bool,
    not a fractional float.
    """
    raise NotImplementedError("check the arguments (stages is a count: _check_count, then at most len(costs)); scale the costs by a power of two so that no sum overflows (math.frexp, math.ldexp); prefix sums make any stage's cost one subtraction; fill best[k][i] with the start of the last stage kept beside it, then walk back from best[stages][n] to the boundaries")


class _AllReduceInBackward(torch.autograd.Function):
    """Identity in forward; in backward, the gradient summed over the group (Megatron's f before a column split)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        raise NotImplementedError("keep the group on ctx for backward; return x's values unchanged, as a view (autograd wants a new output)")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        raise NotImplementedError('a contiguous copy of grad, all-reduced (sum) over ctx.group; no gradient for the group')


class _AllReduceInForward(torch.autograd.Function):
    """The partial results summed over the group in forward; identity in backward (Megatron's g after a row split)."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor, group) -> torch.Tensor:
        raise NotImplementedError('all-reduce (sum) a contiguous copy of partial over the group, and return it')

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        raise NotImplementedError("every rank already holds the whole output's gradient: pass it through, no communication")


def _block(size: int, group, name: str) -> tuple[int, int]:
    """(start, stop) of this rank's block of `size` rows or columns in `group`; ValueError if it does not divide."""
    raise NotImplementedError("the group's world size and this rank's rank IN THE GROUP (dist.get_world_size(group), dist.get_rank(group)); refuse a size they do not divide; then blocks of size // world_size")


class ColumnParallelLinear(nn.Module):
    """This rank's block of a linear layer's OUTPUT features (Megatron-LM's column-parallel linear).

    `ColumnParallelLinear(linear, group=None)`: in a group of W ranks (the default group when None; the group may be
    a subgroup of the world, such as 2 of 3 ranks, so use dist.get_world_size(group) and dist.get_rank(group), the
    size of the group and the rank within it, never the world's), rank r keeps the r-th block
    of out_features / W rows of `linear.weight` (out_features x in_features) and of `linear.bias`, as NEW
    nn.Parameters `self.weight` (out_features / W x in_features) and `self.bias` (None if linear has no bias)
    holding copies (`.detach().clone()`), not views: the full weight is kept nowhere in the module (not as a
    parameter, not as a buffer, not as a plain attribute, not `linear` itself), and `linear` is left unchanged.
    Every rank builds the same `linear` (the same seed), so no communication is needed to build it.
    forward(x): x is the whole input (..., in_features), the same on every rank; return this rank's slice of the
    output, x @ weight.T + bias, of shape (..., out_features / W): the r-th block of what linear(x) gives. No
    communication in forward. In backward, each rank's gradient with respect to x covers only its block of the
    outputs; the whole gradient is their SUM over the group: pass x through an autograd Function that is the
    identity in forward and all-reduces (dist.all_reduce, the sum) the gradient in backward, before the matmul.
    x may have other uses besides this layer (a residual x + mlp(x), a second branch, a term of the loss): only the
    gradient that comes back through this layer is summed, which is why the all-reduce sits inside the layer's
    autograd Function and not in a hook on x (a hook gets x's whole gradient, its other uses' parts included).
    Gradients keep the caller's dtype, and x is left unchanged.
    Raise ValueError if out_features is not divisible by W. Do not all-gather or broadcast weights, and do not use
    torch.distributed.tensor.parallel (switched off in the tests, which log every collective).
    """

    def __init__(self, linear: nn.Linear, group: dist.ProcessGroup | None = None):
        super().__init__()
        raise NotImplementedError("find this rank's block of rows (the helper _block above), then copy those rows of linear.weight and linear.bias into new nn.Parameters; keep the group")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("route x through the Function that sums its gradient over the group, then the linear map of this rank's rows")


class RowParallelLinear(nn.Module):
    """This rank's block of a linear layer's INPUT features (Megatron-LM's row-parallel linear).

    `RowParallelLinear(linear, group=None)`: in a group of W ranks (the default group when None; a subgroup of the
    world too, as for ColumnParallelLinear: the group's size and this rank's rank in it), rank r keeps the
    r-th block of in_features / W COLUMNS of `linear.weight`, as a new nn.Parameter `self.weight`
    (out_features x in_features / W) holding a copy, and the WHOLE bias, copied, as `self.bias` (None if linear
    has no bias): the full weight is kept nowhere in the module, and `linear` is left unchanged.
    forward(x): x is this rank's slice of the input, (..., in_features / W), its r-th block of the last dimension
    (what a ColumnParallelLinear before it returns); compute the partial product x @ weight.T, all-reduce it
    (dist.all_reduce, the sum over the group) so that every rank holds the whole x_full @ W.T, and add the bias
    ONCE, after the all-reduce; return it, of shape (..., out_features), the same on every rank: what linear gives
    on the whole input. Do the all-reduce in an autograd Function that sums in forward and is the identity in
    backward: every rank already holds the whole output's gradient, so backward needs no communication.
    Raise ValueError if in_features is not divisible by W. Do not all-gather or broadcast weights, and do not use
    torch.distributed.tensor.parallel.
    """

    def __init__(self, linear: nn.Linear, group: dist.ProcessGroup | None = None):
        super().__init__()
        raise NotImplementedError("find this rank's block of columns, copy those columns of linear.weight into a new nn.Parameter (.clone() makes it contiguous too), and the whole bias into another; keep the group")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError('the partial product WITHOUT the bias, summed over the group by the Function that sums in forward; then the bias, if any, once')
