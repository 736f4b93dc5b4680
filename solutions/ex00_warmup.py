"""Exercise 00: warm-up. Two small functions that show how exercises, tests and check() work.

Notebook: notebooks/00_welcome.ipynb
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def shard_range(num_items: int, world_size: int, rank: int) -> tuple[int, int]:
    """The half-open range [start, stop) of items that `rank` owns when `num_items` are split over `world_size` ranks.

    Ranks get contiguous ranges that differ in size by at most one, the larger ones first,
    exactly like `torch.tensor_split(torch.arange(num_items), world_size)[rank]`; a rank with no items
    gets an empty range that starts where the previous one stopped. Return a tuple of two Python ints.
    Example: 10 items over 4 ranks -> (0, 3), (3, 6), (6, 8), (8, 10); 2 items over 3 ranks -> (0, 1), (1, 2), (2, 2).
    Raise ValueError if world_size < 1, rank is not in [0, world_size) or num_items < 0; check the arguments
    first, whatever the sizes (with one rank, or no items, rank must still be in range).
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
    """Return the element-wise mean of `tensor` over all ranks of the current process group, as a new tensor.

    Every rank calls this with a tensor of the same shape and dtype (any shape, 0-d and empty ones too);
    every rank gets the same mean back, with the input's shape. A floating-point tensor's mean keeps its dtype
    (float32, float64, bfloat16, float16); an integer tensor's mean is float32, as `/` gives
    (torch.tensor([1, 2]) / 2 is float32). With one rank, the mean is a copy of the input.
    Leave the input unchanged and return a new tensor, never the input itself or a view of it.
    Call it inside a rank started by launch().
    """
    # BEGIN SOLUTION: all_reduce sums in place, so reduce a clone and divide by dist.get_world_size()
    total = tensor.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / dist.get_world_size()
    # END SOLUTION
