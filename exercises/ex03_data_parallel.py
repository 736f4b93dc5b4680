# Exercise file: replace each `raise NotImplementedError(...)` with your code,
# then run `check("ex03")` in the notebook (or `python3 course.py check ex03`).
"""Exercise 03: nn.DataParallel by hand. Scatter a batch, gather outputs, replicate a module, take a step, load a checkpoint.

Notebook: notebooks/03_data_parallel.ipynb

Every function works on any list of devices: ["cpu", "cpu"] stands in for two GPUs on a laptop, and
[torch.device("cuda", 0), torch.device("cuda", 1)] is the real thing. The tests compare your functions with
a single-device computation and, where there are GPUs, with torch.nn.parallel's own functions; they also use the
"meta" device (shapes without data, lesson 01) to see where each piece lands.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch
from torch import nn

from course_lib.parallel.data_parallel import parallel_apply


def _same_mapping(like: Any, items) -> Any:
    """A new mapping of the same type as `like` holding `items`: given, use it in scatter and gather.

    type(like)(items) is right for dict and OrderedDict (torch's scatter does that), but a defaultdict's first
    argument is its default_factory, and torch passes a UserDict along unsplit, as if it were a plain object.
    """
    out = copy.copy(like)  # the same type, with whatever else it carries (a default_factory, a state_dict's _metadata)
    out.clear()
    for key, value in items:
        out[key] = value
    return out


def scatter(inputs: Any, devices: Sequence[torch.device | str], dim: int = 0) -> list[Any]:
    """Split every tensor in `inputs` into per-replica chunks along `dim`, exactly as nn.DataParallel does.

    `inputs` is a tensor, or a mapping, list, tuple or namedtuple nesting tensors and other values to any depth;
    the mappings are dicts, dict subclasses (OrderedDict, defaultdict) and collections.UserDict (`_same_mapping`
    above copies one).
    Return a list (a plain list) with one structure per replica: the same containers, of the very same type
    (a namedtuple stays that namedtuple, a tuple a tuple, an OrderedDict an OrderedDict, a defaultdict a
    defaultdict with the same default_factory, a UserDict a UserDict; keys keep their order), each tensor
    replaced by its chunk along `dim` moved to devices[i], and every other value (None, a number, an object,
    even one holding tensors) the very same object in every replica (not a copy). `inputs` is left unchanged.
    `dim` may be negative, counted from each tensor's last dimension as in torch.chunk.
    Chunk sizes are torch.chunk's: ceil(size / len(devices)) each, the last one smaller, so there may be
    FEWER replicas than devices (a batch of 9 over 4 devices gives chunks of 3, 3, 3: 3 replicas).
    If `inputs` holds no tensor at all, return len(devices) references to it.
    Raise ValueError (never IndexError) if `devices` is empty, if a tensor has no dimension `dim` (a 0-d
    tensor, or `dim` out of range for it), if a tensor is empty along `dim`, or if the tensors do not all have
    the same size along `dim` (DataParallel would silently drop data there).
    Example: scatter({"x": torch.arange(5), "tag": "a"}, ["cpu"] * 2) ->
             [{"x": tensor([0, 1, 2]), "tag": "a"}, {"x": tensor([3, 4]), "tag": "a"}]
    """
    raise NotImplementedError('how many chunks does torch.chunk make of a batch of 9 on 4 devices? Work out how many replicas there will be first, then build replica i by walking the structure')


def gather(outputs: Sequence[Any], device: torch.device | str, dim: int = 0) -> Any:
    """Combine the replicas' outputs (outputs[i] from replica i) into one, on `device`, as nn.DataParallel does.

    Each output is a tensor, None, or a mapping, list, tuple or namedtuple of those (all replicas return the same
    structure; mappings as in `scatter`). The replicas' tensors may be on different devices: each is moved to
    `device` first, then they are concatenated along `dim` (negative counts from the end) in replica order,
    keeping autograd history (backward through the result must reach each replica's output). Zero-dimensional
    tensors (a replica's loss, say) become a vector with one entry per replica (dim 0). None stays None;
    containers keep their very type, as in `scatter`. The outputs are left unchanged.
    Raise TypeError for any other kind of output.
    Example: gather([torch.ones(2, 3), torch.zeros(1, 3)], "cpu").shape -> (3, 3)
    """
    raise NotImplementedError("walk the first output's structure; at a tensor, torch.cat the replicas' tensors on `device` (what does torch.cat need from a 0-d tensor?)")


def replicate(module: nn.Module, devices: Sequence[torch.device | str]) -> list[nn.Module]:
    """One replica of `module` per device, made the way nn.DataParallel makes them, so that gradients come home.

    `module` is on devices[0]. Replica i is a separate module object (its submodules too: replicas run in
    different threads) that computes exactly what `module` computes, on devices[i]:
    - its parameters are `module`'s parameters moved to devices[i] *with autograd recording the move*
      (not new leaves), so that backward through any replica adds into `module`'s own `.grad`;
    - its buffers: replica 0 uses `module`'s very own buffer tensors, so in-place updates (BatchNorm's running
      statistics) reach `module`; every other replica gets its own copy, on devices[i], whose updates are lost.
    `module` itself must be left unchanged: the same Parameter objects, buffers and state_dict keys.
    """
    raise NotImplementedError("copy.deepcopy gives separate modules; what must a copy's parameter be for backward to reach module's .grad: a new leaf, or param.to(device)? (A plain tensor cannot be assigned over a Parameter: delete it from _parameters first.) Which replica may share the module's buffers?")


def data_parallel_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: tuple, targets: torch.Tensor,
                       loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
                       devices: Sequence[torch.device | str]) -> float:
    """One training step of `model` the way nn.DataParallel does it; return the loss as a float.

    `model` and `optimizer` live on devices[0]; `inputs` is the tuple of positional arguments for the model
    (tensors or nested structures, batch along dim 0); `targets` is on devices[0]. Scatter the inputs with your
    `scatter`, make replicas with your `replicate` on the devices actually used (one per chunk), run each replica
    on its chunk in a thread of its own (course_lib's `parallel_apply`, imported above, does that and keeps the
    outputs in replica order), gather the outputs on devices[0] with your `gather`, compute
    `loss_fn(gathered, targets)` once, on the whole batch (one call, never one per replica), backpropagate and
    step the optimizer (call only its zero_grad() and step(): the tests may pass any object with those two).
    Return a Python float (not a tensor); `inputs` and `targets` are left unchanged.
    The model's parameters afterwards must equal those of a plain single-device step on the whole batch
    (zero the old gradients first; average nothing), and every forward must run on a replica, not on `model`.
    """
    raise NotImplementedError("follow the docstring's order; what happens to last step's gradients, and where is the loss computed?")


def adapt_state_dict(state_dict: Mapping[str, Any], model: nn.Module) -> "OrderedDict[str, Any]":
    """A new OrderedDict of `state_dict`'s entries, keys made to fit `model` (checkpoints with or without DataParallel).

    A model wrapped in nn.DataParallel (or DistributedDataParallel) keeps the real model as `.module`, so its
    state_dict keys start with "module." ("module.fc.weight"). Compare with `model.state_dict()`'s keys:
    - the checkpoint is prefixed and `model` is not: remove the leading "module." from every key;
    - `model` is wrapped and the checkpoint is not: add "module." in front of every key;
    - the keys already fit: keep them as they are (in a new OrderedDict all the same).
    Only a leading "module." is the wrapper's: "head.module.weight" or "submodule.bias" keep theirs.
    Keep the order and the very same value objects (no copies). `state_dict` itself (a dict or an OrderedDict)
    is left unchanged: same keys, same order, same values; the result is always a new OrderedDict, even when no
    key changes. Raise KeyError naming a key of `model` that the adapted checkpoint still lacks, or a key of the
    checkpoint that `model` does not have.
    """
    raise NotImplementedError('which of three key lists (as they are, without a leading "module.", with one added) matches model.state_dict()\'s keys?')
