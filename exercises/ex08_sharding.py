# Exercise file: replace each `raise NotImplementedError(...)` with your code,
# then run `check("ex08")` in the notebook (or `python3 course.py check ex08`).
"""Exercise 08: Sharded data parallel. ZeRO's memory by stage, a sharded optimizer (ZeRO-1), FSDP by hand (ZeRO-3).

Notebook: notebooks/08_sharding_and_multinode.ipynb

Three pieces, from arithmetic to ranks: the bytes of model state one GPU holds at each ZeRO stage (the ZeRO
paper's count for mixed-precision Adam); ShardedOptimizer, an optimizer whose state is split across the ranks,
each rank stepping only the parameters it owns and broadcasting them afterwards (ZeRO stage 1); and MiniFSDP,
which keeps only a 1/N shard of every linear and embedding weight on each rank, all-gathers a layer's full weight
just before it runs, frees it after, and reduce-scatters its gradient in backward (ZeRO stage 3, FSDP's idea).
Everything runs on the CPU. The tests compare with references computed in the test process: the paper's formula
and its Figure 1, torch's own optimizer on one process with the averaged gradients, and a single process training
on the whole batch. They run the distributed pieces in 2 and 3 gloo ranks and log every collective your code
starts (its kind, size, dtype); while your code runs, torch's FSDP (torch.distributed.fsdp), its
ZeroRedundancyOptimizer, torch.distributed.tensor, torch's functional collectives and the lesson's own helpers
in course_lib.parallel.sharding are switched off, so each piece has to be built, not borrowed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

STAGES = (0, 1, 2, 3)  # ZeRO's stages: 0 is plain data parallelism (DDP), 3 shards everything


def _check_whole(name: str, value: int, minimum: int, what: str) -> None:
    """Raise ValueError naming the argument unless value is a whole number (an int, not a bool), `minimum` or more."""
    raise NotImplementedError('bool is a subclass of int: refuse it first; then int and at least minimum')


def model_state_bytes(num_params: int, dp_degree: int, stage: int, optimizer_bytes_per_param: int = 12) -> float:
    """Bytes of model state one GPU holds under ZeRO stage `stage` with `dp_degree` data-parallel GPUs.

    The ZeRO paper (Rajbhandari et al. 2020, arXiv:1910.02054, §3 and Figure 1) counts, for a model of
    Ψ = `num_params` parameters trained with mixed-precision Adam:
    - 2Ψ bytes of fp16 parameters,
    - 2Ψ bytes of fp16 gradients,
    - KΨ bytes of optimizer state, K = `optimizer_bytes_per_param` (12 for Adam: an fp32 copy of the parameters,
      the momentum and the variance, 4 bytes each).
    With N = `dp_degree` GPUs, each stage splits one more of them into N equal shards:
    - stage 0 (plain data parallelism): (2 + 2 + K)Ψ, everything on every GPU;
    - stage 1 (P_os, the optimizer state sharded): 2Ψ + 2Ψ + KΨ/N;
    - stage 2 (P_os+g, the gradients too):         2Ψ + (2 + K)Ψ/N;
    - stage 3 (P_os+g+p, the parameters too):      (2 + 2 + K)Ψ/N.
    Figure 1's example: Ψ = 7.5e9, N = 64, K = 12 gives 120e9, 31.4e9, 16.6e9 and 1.875e9 bytes (the paper's
    120 GB, 31.4 GB, 16.6 GB and 1.9 GB, with GB = 1e9 bytes). Activations and temporary buffers are not model
    state: they are not counted.
    Return a Python float. Raise ValueError, naming the argument and saying what to pass, unless num_params and
    optimizer_bytes_per_param are whole numbers (ints, not bools) 0 or more, dp_degree a whole number 1 or more,
    and stage one of 0, 1, 2, 3.
    """
    raise NotImplementedError('check every argument (bool is a subclass of int); then the three parts, each divided by N once its stage shards it')


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO stage 1 in a page: each rank keeps the optimizer state of the parameters it owns, and only those.

    `ShardedOptimizer(params, optimizer_cls, **defaults)`, in a rank whose default process group is initialised
    (every rank builds it with the same parameters, in the same order):

        optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3, weight_decay=0.1)
        for batch in my_batches:
            optimizer.zero_grad()
            loss_fn(model(batch)).backward()
            ...                              # the gradients averaged over the ranks (DDP, or an all-reduce)
            optimizer.step()                 # every rank's parameters updated, whole, equal everywhere

    It is a torch.optim.Optimizer: call `super().__init__(params, defaults)`, which calls your
    `add_param_group` once per group, so `self.param_groups` holds EVERY parameter, with the group's
    hyperparameters (a scheduler or the caller may change `group["lr"]` between steps: the next step must use it),
    and the inherited `zero_grad` clears every parameter's gradient.
    Ownership: each parameter, a whole tensor (not a slice), is owned by exactly one rank. Assign them greedily by
    size: in the order they arrive, each to the rank that owns the fewest elements so far (the lowest rank on a
    tie); every rank computes the same assignment, no communication. A parameter listed twice (a tied weight
    reached through two modules) is owned once.
    The inner optimizer, `self.optimizer = optimizer_cls(groups, **defaults)`, is built over this rank's own
    parameters only (one group per group of self.param_groups, with its hyperparameters; a group may be empty on
    a rank), so its state (AdamW's exp_avg and exp_avg_sq, SGD's momentum_buffer) exists for those only. A group
    added later with `add_param_group` is assigned the same way and added to the inner optimizer.
    `step(closure=None)`: call the closure (under torch.enable_grad()) if given, copy each group's hyperparameters
    (every key but "params") into the inner optimizer's matching group, step the inner optimizer, then
    `dist.broadcast` every parameter from its owner (in place, in the same order on every rank), so that every
    rank holds every parameter, whole and equal. Return the closure's loss (None without one).
    Never all-reduce the parameters, and do not use torch's ZeroRedundancyOptimizer (switched off in the tests).
    """

    def __init__(self, params: Iterable[Any], optimizer_cls: type[torch.optim.Optimizer], **defaults: Any):
        raise NotImplementedError('remember optimizer_cls, defaults, the rank, the world size and a load per rank before super().__init__ (which calls add_param_group); then build the inner optimizer over the own parameters of every group')

    def _own_group(self, group: dict[str, Any]) -> dict[str, Any]:
        """The group as the inner optimizer sees it: its hyperparameters, and this rank's parameters only."""
        raise NotImplementedError('every key of the group but "params", and the parameters whose owner is this rank')

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise NotImplementedError("super().add_param_group fills in the defaults and checks the group; then an owner for each new parameter (the least loaded rank, lowest on a tie), and the rank's own share of the group into the inner optimizer once it exists")

    @torch.no_grad()
    def step(self, closure=None):
        raise NotImplementedError("the closure under enable_grad; the outer groups' hyperparameters into the inner groups; the inner step; then one broadcast per parameter from its owner, in place (no_grad: the parameters are leaves)")


SHARDED_TYPES = (nn.Linear, nn.Embedding)  # the layers whose weight MiniFSDP shards


class _GatherWeight(torch.autograd.Function):
    """Forward: the full weight, all-gathered from the ranks' shards; backward: the gradient, reduce-scattered."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, rows: int, compute_dtype, fsdp: "MiniFSDP") -> torch.Tensor:
        raise NotImplementedError('cast the shard to the compute dtype BEFORE communicating (half the bytes in bf16); dist.all_gather into a list of world-size chunks; cat them and cut the padding off (the first `rows` rows); keep what backward needs on ctx')

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        raise NotImplementedError("the full gradient in the shard's dtype (fp32), padded to world size x shard rows; start a reduce-scatter (sum) of its chunks into a new shard-sized tensor, async_op=True, and hand it to MiniFSDP, which waits and averages in finish_gradient_synchronization; no gradient through autograd here")


class MiniFSDP(nn.Module):
    """Fully sharded data parallelism in a page (ZeRO stage 3, FSDP's idea), for linear and embedding weights.

    `MiniFSDP(module, compute_dtype=None)` wraps `module` (kept, the very same object, as `self.module`;
    `forward` calls it), in a rank whose default process group is initialised; every rank builds the same module
    (the same seed), so the constructor needs no communication. Use it like MiniDDP:

        model = MiniFSDP(net)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)   # built AFTER wrapping: it must see the shards
        for inputs, targets in my_batches:      # this rank's share of each global batch
            optimizer.zero_grad()
            loss_fn(model(inputs), targets).backward()
            model.finish_gradient_synchronization()
            optimizer.step()

    The constructor, for every nn.Linear and nn.Embedding in module.modules() (W ranks, this one r):
    - the weight, of R rows (dim 0), is cut into W shards of S = ceil(R / W) rows, the last padded with zero rows
      if W does not divide R; this rank keeps only its shard, rows r*S .. (r+1)*S - 1 of the padded weight, as a
      NEW fp32 nn.Parameter (a copy, not a view: the full weight is kept nowhere), which is what
      `self.parameters()`, so the optimizer, sees in place of the weight;
    - every other parameter (biases, norms' weights) stays replicated: whole on every rank, unchanged.
    So each rank's parameters add up to S x (columns) elements per sharded weight, plus the replicated ones.
    A forward pre-hook on each such layer all-gathers its full weight just before the layer runs (dist.all_gather,
    the list form, then the padding cut off) and sets it as the layer's `weight` attribute, through an autograd
    Function (see _GatherWeight) so that backward reaches the shard; a forward hook drops the attribute again
    after the layer ran (autograd keeps what the layer's backward needs until that backward has run: after it,
    the full weight and its full gradient are referenced nowhere).
    With `compute_dtype` (e.g. torch.bfloat16), a sharded layer computes in that dtype: the shard is cast before
    the all-gather (half the bytes travel), the layer's floating inputs and a linear's bias are cast too, and its
    output is cast back to float32, so the rest of the model (norms, activations) runs as before. The shards, the
    master weights the optimizer updates, stay fp32.
    In backward, the full weight's gradient (fp32) is reduce-scattered (dist.reduce_scatter, the list form, a sum
    over the ranks, then divided by W: the mean), each rank receiving its shard's rows; start it with
    async_op=True and let `finish_gradient_synchronization()` (after backward, before optimizer.step()) wait for
    it, write it into each shard's .grad, and all-reduce (then divide by W) every replicated parameter's gradient.
    Afterwards every parameter's .grad is fp32, shaped like the parameter, and the same as one process would get
    from the mean loss over the union of the ranks' equally sized batches (its shard's rows, for a sharded
    weight). Never all-reduce a sharded weight's full gradient.
    `gather_full_params()` (a collective: every rank calls it) returns a new dict from every parameter name of
    `self.module` as it was before wrapping ("0.weight", "0.bias", ...) to its full fp32 tensor (detached copies).
    A weight shared by two layers is not supported. Use only dist.all_gather, dist.reduce_scatter, dist.all_reduce
    and dist.broadcast (the tensor forms warn in torch 2.14): torch's FSDP, torch.distributed.tensor and torch's
    functional collectives are switched off in the tests.
    """

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None):
        super().__init__()
        self.module = module
        raise NotImplementedError('for each nn.Linear / nn.Embedding: pad the weight\'s rows to W x S, keep rows r*S .. (r+1)*S - 1 as a new fp32 Parameter in the layer\'s _parameters["weight"], and register a forward pre-hook (gather, set the attribute) and a forward hook (drop it); remember every parameter\'s original name and whether it is sharded')

    def _gather(self, layer: nn.Module, args: tuple) -> tuple:
        """The forward pre-hook: the layer's full weight as its `weight` attribute, its inputs cast if need be."""
        raise NotImplementedError('take the shard out of _parameters (a plain tensor cannot replace a registered Parameter), set layer.weight to _GatherWeight.apply(shard, ...); with a compute dtype, the bias the same way (cast), and floating inputs cast')

    def _release(self, layer: nn.Module, args: tuple, output: Any) -> Any:
        """The forward hook: drop the full weight (and the cast bias), put the parameters back; output to fp32."""
        raise NotImplementedError('delete the attributes, restore the shard (and bias) into _parameters; with a compute dtype, return the output cast to float32')

    def finish_gradient_synchronization(self) -> None:
        """After backward, before optimizer.step(): finish the reduce-scatters, average the replicated gradients."""
        raise NotImplementedError("wait for each pending reduce-scatter, divide by W, write (or add) it into the shard's .grad; then all-reduce each replicated parameter's .grad and divide by W; clear the pending list")

    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter of the wrapped module by its original name, full and fp32 (a collective)."""
        raise NotImplementedError('replicated: a detached fp32 copy; sharded: all_gather the shards, cat, cut the padding off')

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)
