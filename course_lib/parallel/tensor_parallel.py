"""Tensor parallelism: what a Megatron-style MLP block all-reduces, and what the ranks really sent (notebook 07).

    tp_comm_volume(batch, seq, hidden, tp)   bytes all-reduced per transformer MLP block, and each rank's ring traffic
    logged_collectives()                     inside a rank: every all_reduce, all_gather, reduce_scatter and broadcast
                                             it issues, with its size, from dist.* calls and from DTensor alike

The notebook puts the two side by side: the count from the paper, and what a parallelize_module'd MLP (or one
written by hand with dist.all_reduce) sent on gloo.
"""

from __future__ import annotations

import contextlib

from course_lib.parallel import whole_number

__all__ = ["tp_comm_volume", "logged_collectives", "MEGATRON_SOURCE"]

MEGATRON_SOURCE = ("Shoeybi et al. 2019, Megatron-LM, arXiv:1909.08053 §3: an MLP block is a column-parallel "
                   "Linear then a row-parallel Linear, with operator f (identity forward, all-reduce backward) before "
                   "and g (all-reduce forward, identity backward) after; a transformer layer has 'two all-reduces in "
                   "the forward path and two in the backward path', one each for attention and for the MLP")



def tp_comm_volume(batch: int, seq: int, hidden: int, tp: int, dtype_bytes: int = 2) -> dict:
    """Bytes all-reduced by one tensor-parallel transformer MLP block in one training step (notebook 07).

    Megatron-LM (MEGATRON_SOURCE): the block's output, batch × seq × hidden activations, is all-reduced once in the
    forward (g), and the gradient of its input, the same shape, once in the backward (f). A whole transformer layer
    does the same again for attention: twice these numbers. With tp = 1 nothing is split and nothing is sent
    (Megatron-LM skips the all-reduce of a group of one).

    Keys: activation_bytes (one all-reduce's tensor: batch·seq·hidden·dtype_bytes), forward_all_reduces,
    backward_all_reduces, all_reduced_bytes (the tensors' bytes, forward and backward together), ring_bytes_per_rank
    (2(tp − 1)/tp × all_reduced_bytes: what each rank sends, and receives, in lesson 04's ring all-reduce),
    transformer_layer_all_reduced_bytes (attention's too), source.
    """
    batch, seq, hidden = whole_number(batch, "batch"), whole_number(seq, "seq"), whole_number(hidden, "hidden")
    tp, dtype_bytes = whole_number(tp, "tp"), whole_number(dtype_bytes, "dtype_bytes")
    activation = batch * seq * hidden * dtype_bytes
    reduces = 0 if tp == 1 else 1
    total = 2 * reduces * activation
    return {"activation_bytes": activation, "forward_all_reduces": reduces, "backward_all_reduces": reduces,
            "all_reduced_bytes": total, "ring_bytes_per_rank": 2 * (tp - 1) * total / tp,
            "transformer_layer_all_reduced_bytes": 2 * total, "source": MEGATRON_SOURCE}


# Every way a collective reaches the dispatcher in torch 2.11–2.14: c10d::* from dist.all_reduce & co. (through
# ProcessGroup), _c10d_functional::* from functional collectives, which DTensor (parallelize_module) uses.
_COLLECTIVES = {
    "all_reduce": ["c10d::allreduce_", "c10d::allreduce_coalesced_", "_c10d_functional::all_reduce",
                   "_c10d_functional::all_reduce_", "_c10d_functional::all_reduce_coalesced",
                   "_c10d_functional::all_reduce_coalesced_"],
    "all_gather": ["c10d::allgather_", "c10d::_allgather_base_", "c10d::allgather_coalesced_",
                   "c10d::allgather_into_tensor_coalesced_", "_c10d_functional::all_gather_into_tensor",
                   "_c10d_functional::all_gather_into_tensor_coalesced", "_c10d_functional::all_gather_into_tensor_out",
                   "_c10d_functional_autograd::all_gather_into_tensor"],
    "reduce_scatter": ["c10d::reduce_scatter_", "c10d::_reduce_scatter_base_", "c10d::reduce_scatter_tensor_coalesced_",
                       "_c10d_functional::reduce_scatter_tensor", "_c10d_functional::reduce_scatter_tensor_coalesced",
                       "_c10d_functional::reduce_scatter_tensor_out",
                       "_c10d_functional_autograd::reduce_scatter_tensor"],
    "broadcast": ["c10d::broadcast_", "_c10d_functional::broadcast", "_c10d_functional::broadcast_"],
}
_OP_OF = {schema: name for name, schemas in _COLLECTIVES.items() for schema in schemas}
_INPUTS = ("input", "inputs", "input_tensor", "input_tensors", "input_list", "tensors")  # this rank's contribution


def _tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def _group_name(arguments: dict) -> str:
    if isinstance(arguments.get("group_name"), str):
        return arguments["group_name"]
    group = arguments.get("process_group")
    try:
        from torch._C._distributed_c10d import ProcessGroup

        return ProcessGroup.unbox(group).group_name
    except Exception:  # noqa: BLE001 - a torch whose ScriptObject does not unbox: the name is only informative
        return ""


@contextlib.contextmanager
def logged_collectives(*, all_groups: bool = False):
    """Inside a rank: record every all_reduce, all_gather, reduce_scatter and broadcast it issues (notebook 07).

        with logged_collectives() as sent:
            y = tp_mlp(x); y.sum().backward()
        # sent: [{"op": "all_reduce", "numel": 4096, "dtype": "torch.float32", "bytes": 16384, "group": "0"}, ...]

    Yields a list, filled as the collectives are issued (so complete on exit), in order. numel, dtype and bytes are
    this rank's input: the tensor all-reduced or broadcast, the piece it contributes to an all_gather, the whole
    tensor it reduce-scatters (a coalesced call is one entry with the sum). Only the default process group's unless
    all_groups=True. It sees dist.all_reduce & co. (in any async mode) and DTensor's collectives (parallelize_module,
    which go through torch's functional collectives and never through the ProcessGroup methods that a patch of
    dist.* or ProcessGroup would catch), in the forward and in autograd's backward: it is a TorchDispatchMode,
    torch.distributed.tensor.debug.CommDebugMode's mechanism, active in this thread and the backward it starts.
    """
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("logged_collectives() runs inside a rank: no process group is initialised here (start "
                           "ranks with course_lib.dist.launch)")
    default = dist.group.WORLD.group_name
    log: list[dict] = []

    class _Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if any(issubclass(t, DTensor) for t in types):
                return NotImplemented  # DTensor first turns itself into plain ops, its collectives included
            op = _OP_OF.get(func._schema.name)
            if op is not None:
                arguments = {a.name: (args[i] if i < len(args) else kwargs.get(a.name))
                             for i, a in enumerate(func._schema.arguments)}
                group = _group_name(arguments)
                if all_groups or group in (default, ""):  # "": a torch whose group cannot be told: kept
                    name = next(n for n in _INPUTS if n in arguments)
                    tensors = _tensors(arguments[name])
                    numel = sum(t.numel() for t in tensors)
                    log.append({"op": op, "numel": numel, "dtype": str(tensors[0].dtype) if tensors else "",
                                "bytes": sum(t.numel() * t.element_size() for t in tensors), "group": group})
            return func(*args, **kwargs)

    with _Log():
        yield log
