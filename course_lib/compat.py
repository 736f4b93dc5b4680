"""The torch names that differ across the torch versions the course supports (2.11 to 2.14): one place (notebook 04).

The supported range is pyproject.toml's `torch>=2.11,<2.15`; a fresh environment gets constraints.txt's 2.14.1.

The course is written against the newest names. Where an older torch in the supported range lacks one, the
function here calls the older name that does the same thing. Everything that is the same in every supported
version is imported from torch directly, never from here.

    from course_lib.compat import all_gather_single, reduce_scatter_single
"""

from __future__ import annotations

import torch
import torch.distributed as dist

#: (major, minor) of the torch that is running, e.g. (2, 11).
TORCH_VERSION: tuple[int, int] = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


# Both functions look the torch function up when they are called, not when this module is imported, so that
# whatever is on torch.distributed at that moment runs (the graded tests switch the built-in collectives off
# inside ranks by replacing them there).


def all_gather_single(output_tensor, input_tensor, group=None, async_op=False):
    """Gather every rank's `input_tensor` into the one tensor `output_tensor` (notebook 04).

    torch 2.13 added `dist.all_gather_single`; 2.11 and 2.12 call it `dist.all_gather_into_tensor`
    (from 2.13 on that old name still works but warns that it is deprecated).
    """
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output_tensor, input_tensor, group=group, async_op=async_op)


def reduce_scatter_single(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    """Reduce `input` over the ranks, then keep this rank's slice of the result in `output` (notebook 04).

    torch 2.13 added `dist.reduce_scatter_single`; 2.11 and 2.12 call it `dist.reduce_scatter_tensor`
    (from 2.13 on that old name still works but warns that it is deprecated).
    """
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return reduce_scatter(output, input, op=op, group=group, async_op=async_op)


__all__ = ["TORCH_VERSION", "all_gather_single", "reduce_scatter_single"]
