"""The log of collectives a rank starts, as graded tests of exercises 07 and 08 see it.

    from course_lib.grading.collective_log import CollectiveLog

    with CollectiveLog() as log:       # inside a rank, in the child
        layer(x).sum().backward()
    log.events   # [["allreduce", 4096, "torch.float32", "SUM", "0"], ...]

It patches the process group's methods, where every torch.distributed function passes (dist.all_reduce is
"allreduce", dist.all_gather_into_tensor "_allgather_base", dist.reduce_scatter "reduce_scatter", ...). torch's
functional collectives bypass them: course_lib.grading.shortcuts switches those off while an exercise is graded.
Each event: [method, elements of its first argument, its dtype, the reduce op ("SUM", "AVG", ... or None), the
group's name], and for a send or a receive the peer too (its rank in the group; None for recv_anysource).
Nothing is logged while `active` is False.
"""

from __future__ import annotations

__all__ = ["CollectiveLog", "COLLECTIVES"]

COLLECTIVES = ("allreduce", "allreduce_coalesced", "allgather", "_allgather_base", "allgather_coalesced",
               "allgather_into_tensor_coalesced", "all_gather_single", "all_gather_single_coalesced", "broadcast",
               "reduce", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single",
               "reduce_scatter_single_coalesced", "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base",
               "all_to_all_single", "gather", "gather_into_tensor", "gather_single", "scatter", "send", "recv",
               "recv_anysource", "barrier")
REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX")


def _elements(value) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, (list, tuple)):
        return sum(_elements(v) for v in value)
    return 0


def _dtype(value) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return str(value.dtype)
    if isinstance(value, (list, tuple)):
        return next((d for d in map(_dtype, value) if d), "")
    return ""


class CollectiveLog:
    """Inside a rank: every collective started while it is entered (and `active`), in order, in `events`."""

    def __init__(self):
        self.events: list[list] = []
        self.active = True
        self._saved: list = []

    def __enter__(self) -> "CollectiveLog":
        from torch._C._distributed_c10d import ProcessGroup

        for name in COLLECTIVES:
            original = getattr(ProcessGroup, name, None)
            if original is not None:
                # Saved as the class holds it: pybind11 keeps a method in an `instancemethod` descriptor, and getattr
                # on the class unwraps it to a plain builtin that no longer binds self once set back.
                self._saved.append((ProcessGroup, name, ProcessGroup.__dict__.get(name)))
                setattr(ProcessGroup, name, self._logged(name, original))
        return self

    def _logged(self, name, original):
        import torch.distributed as dist

        log = self

        def collective(group, *args, **kwargs):
            if log.active:
                options = next((a for a in args if hasattr(a, "reduceOp")), kwargs.get("opts"))
                op = getattr(options, "reduceOp", None)
                op_name = None if op is None else next(
                    (n for n in REDUCE_OPS if op == getattr(dist.ReduceOp, n)), "other")
                tensors = args[0] if args else None
                event = [name, _elements(tensors), _dtype(tensors), op_name, group.group_name]
                if name in ("send", "recv"):  # ProcessGroup.send(tensors, dst, tag), recv(tensors, src, tag)
                    peer = args[1] if len(args) > 1 else kwargs.get("dstRank", kwargs.get("srcRank"))
                    event.append(None if peer is None else int(peer))
                log.events.append(event)
            return original(group, *args, **kwargs)

        return collective

    def __exit__(self, *exc) -> bool:
        for owner, name, original in reversed(self._saved):
            if original is None:  # inherited: drop the patch, the base class's method shows again
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._saved.clear()
        return False
