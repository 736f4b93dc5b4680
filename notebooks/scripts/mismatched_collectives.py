"""Lesson 05: two ranks that call a collective with different shapes, a bug to find.

    TORCH_DISTRIBUTED_DEBUG=DETAIL python3 course.py torchrun --standalone --nproc-per-node=2 \
        notebooks/scripts/mismatched_collectives.py

With TORCH_DISTRIBUTED_DEBUG=DETAIL set before torch is imported, every collective is checked first and the
mismatch is named at once; without it the ranks wait for each other until the group's timeout (5 s here).
"""

from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=5))
    try:
        rank = dist.get_rank()
        tensor = torch.ones(3 if rank == 0 else 4)   # the bug: the ranks disagree on the shape
        dist.all_reduce(tensor)
        print(f"rank {rank}: {tensor.tolist()}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
