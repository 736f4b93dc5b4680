# Exercise file: replace each `raise NotImplementedError(...)` with your code,
# then run `check("ex01")` in the notebook (or `python3 course.py check ex01`).
"""Exercise 01: devices and memory. Move batches, count training memory, predict activations, pick each rank's device.

Notebook: notebooks/01_devices_and_memory.ipynb
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


def to_device(batch: Any, device: torch.device | str) -> Any:
    """Return a copy of `batch` with every tensor moved to `device`, keeping the structure exactly.

    `batch` may be a tensor, or a mapping, list, tuple or namedtuple nesting tensors and other values
    (strings, numbers, None, any other object...) to any depth. Containers come back as new containers of the
    same type: a list stays a list, a tuple a tuple, a namedtuple that namedtuple, and a mapping (dict,
    OrderedDict, UserDict, or defaultdict, which keeps its default_factory) keeps its type and its keys' order.
    A string is a value, not a sequence of characters. Each tensor `t` becomes `t.to(device)`: the same values,
    dtype and shape, and it keeps `requires_grad` and its place in the autograd graph (gradients flow back to
    `t`); a tensor already on `device` may come back as itself, as `.to()` does. Every other value comes back
    as it is: the very same object, not a copy. The input batch is left unchanged.
    Raise TypeError if `device` is not a str or torch.device, saying what to pass instead (whatever the batch
    holds).
    Example: to_device({"x": x, "ids": [1, 2]}, "cuda:0") -> {"x": x.to("cuda:0"), "ids": [1, 2]}
    """
    raise NotImplementedError('recurse: Tensor -> .to(device); Mapping -> same keys (defaultdict: default_factory first); namedtuple -> type(b)(*items); list/tuple -> type(b)(items)')


def training_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes held right now by the model's parameters, their gradients, and the optimizer's state.

    Return a dict {"parameters": ..., "gradients": ..., "optimizer_states": ...} of three Python ints, in bytes:
    - parameters: every parameter of `model` once (a parameter shared by two layers counts once);
    - gradients: the `.grad` of each of those parameters, where it exists, whether or not the parameter still
      requires grad (None counts 0: parameters frozen before backward, or after zero_grad());
    - optimizer_states: every tensor in `optimizer.state`, whichever parameters it belongs to (the optimizer may
      hold only part of the model, another optimizer the rest, or parameters outside the model too). Adam keeps
      exp_avg and exp_avg_sq per parameter, plus a small `step` tensor; SGD with momentum keeps momentum_buffer.
      Most optimizers make their states at the first step (Adagrad already when it is built).
    A tensor's bytes are numel() * element_size(). Leave the model and the optimizer unchanged: optimizer.state
    is a defaultdict, so `optimizer.state[p]` for a parameter it does not hold adds an entry; read it with
    .values() or .items(). Raise TypeError if `model` is not an nn.Module or `optimizer` is not a
    torch.optim.Optimizer.
    """
    raise NotImplementedError("sum numel() * element_size() over model.parameters(), their .grad, and the tensors in optimizer.state's dicts")


def mlp_activation_bytes(batch_size: int, features: int, hidden: int, classes: int, depth: int,
                         dtype: torch.dtype = torch.float32) -> int:
    """Predict the bytes of activations autograd saves for backward in one forward pass of an MLP.

    The model is `course_lib.data.small_mlp(features, hidden, classes, depth)`: `depth` times
    (Linear -> ReLU), then a Linear to `classes` logits, in `dtype`, called on an input of shape
    (batch_size, features) that does not require grad, without a loss. Count each saved tensor's memory
    once (two ops may save the same tensor) and leave out the parameters (they are not activations).
    Think about what each op needs for its backward: a Linear needs its input to compute the weight's
    gradient; ReLU keeps its output to know where the gradient passes.
    Return a Python int. Raise ValueError if any size (classes too, though the formula may not need it) is not
    a whole number of 1 or more.
    """
    raise NotImplementedError("each Linear saves its input; each ReLU saves its output, which is the next Linear's input")


def device_for_rank(env: Mapping[str, str], gpu_count: int) -> torch.device:
    """The device a rank should use, from its launcher's environment variables and the GPUs on its machine.

    `env` is a mapping like os.environ under torchrun (read it, do not change it): LOCAL_RANK (this rank's
    number on its machine) and LOCAL_WORLD_SIZE (ranks on this machine) are strings. RANK and WORLD_SIZE count
    across all machines: do not use them (on the second machine, RANK 8 would ask for cuda:8, and WORLD_SIZE
    may exceed the machine's GPUs when each machine has a GPU for each of its ranks).
    Return torch.device("cuda", LOCAL_RANK) when the machine has a GPU for every local rank
    (gpu_count >= LOCAL_WORLD_SIZE), else torch.device("cpu") (ranks cannot share GPUs under NCCL).
    Raise ValueError, whatever gpu_count is, if LOCAL_RANK or LOCAL_WORLD_SIZE is missing (say how to start
    the ranks: torchrun) or not a whole number, or if LOCAL_RANK is not in [0, LOCAL_WORLD_SIZE) (a negative
    one too); the message names the variable. Raise ValueError if gpu_count < 0, naming gpu_count.
    """
    raise NotImplementedError('read int(env["LOCAL_RANK"]) and int(env["LOCAL_WORLD_SIZE"]), validate, then cuda:LOCAL_RANK or cpu')
