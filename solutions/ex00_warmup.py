"""Exercise 00: warm-up. Two small functions that show how exercises, tests and check() work.

Notebook: notebooks/00_welcome.ipynb
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def shard_range(num_items: int, world_size: int, rank: int) -> tuple[int, int]:
    """The half-open range [start, stop) of items that `rank` owns when `num_items` are split over `world_size` ranks.

    Ranks get contiguous ranges that differ in size by at most one, the larger ones first,
    exactly like `torch.tensor_split(torch.arange(num_items), world_size)[rank]`.
    Example: 10 items over 4 ranks -> (0, 3), (3, 6), (6, 8), (8, 10).
    Raise ValueError if world_size < 1, rank is not in [0, world_size) or num_items < 0.
    """
    # BEGIN SOLUTION: the first (num_items % world_size) ranks get one extra item; use divmod
    if world_size < 1 or not 0 <= rank < world_size or num_items < 0:
        raise ValueError(f"need world_size >= 1, 0 <= rank < world_size and num_items >= 0, "
                         f"got num_items={num_items}, world_size={world_size}, rank={rank}")
    base, extra = divmod(num_items, world_size)
    start = rank * base + min(rank, extra)
    stop = start + base + (1 if rank < extra else 0)
    return start, stop
    # END SOLUTION


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Return the element-wise mean of `tensor` over all ranks of the current process group.

    Every rank calls this with a tensor of the same shape; every rank gets the same mean back.
    Leave the input unchanged (work on a copy). Call it inside a rank started by launch().
    """
    # BEGIN SOLUTION: all_reduce sums in place, so reduce a clone and divide by dist.get_world_size()
    total = tensor.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / dist.get_world_size()
    # END SOLUTION
