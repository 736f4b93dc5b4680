"""Launch overhead: `course_lib.dist.launch` against `torch.multiprocessing.spawn` doing the same work.

    python benchmarks/launch_overhead.py

Both start gloo CPU ranks that initialise and destroy a process group; the table gives warm medians
and ranges (the first launch, which starts the fork server, is left out).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course_lib.devices import usable_cores  # noqa: E402
from course_lib.dist import launch  # noqa: E402
from course_lib.tables import print_table  # noqa: E402


def main(repeats: int = 7) -> None:
    """Warm launch overhead of `launch` against `torch.multiprocessing.spawn` doing the same work."""
    rows = []
    for world_size in (2, 4):
        ours, theirs = [], []
        launch(_bench_rank, world_size, quiet=True)  # warm the fork server
        for _ in range(repeats):
            t0 = time.perf_counter()
            launch(_bench_rank, world_size, quiet=True)
            ours.append(time.perf_counter() - t0)
        for _ in range(max(3, repeats // 2)):
            t0 = time.perf_counter()
            _spawn_same_work(world_size)
            theirs.append(time.perf_counter() - t0)
        ours.sort()
        theirs.sort()
        median_ours, median_theirs = ours[len(ours) // 2], theirs[len(theirs) // 2]
        rows.append([
            world_size,
            f"{median_ours:.3f}",
            f"{ours[0]:.3f}–{ours[-1]:.3f}",
            f"{median_theirs:.2f}",
            f"{theirs[0]:.2f}–{theirs[-1]:.2f}",
            f"{median_theirs / median_ours:.0f}×",
        ])
    print(f"Warm launch overhead, gloo CPU ranks that init and destroy a process group "
          f"({usable_cores()} cores, torch {__import__('torch').__version__})")
    print_table(
        ["ranks", "launch median s", "launch range s", "mp.spawn median s", "mp.spawn range s", "spawn / launch"],
        rows,
    )


def _bench_rank(rank: int, world_size: int) -> int:
    return rank


def _spawn_rank(rank: int, world_size: int, store_path: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(store_path, world_size), rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    try:
        dist.barrier()  # as launch's ranks do: no rank exits while another is still connecting
    finally:
        dist.destroy_process_group()


def _spawn_same_work(world_size: int) -> None:
    import torch.multiprocessing

    with tempfile.TemporaryDirectory() as scratch:
        torch.multiprocessing.spawn(_spawn_rank, args=(world_size, os.path.join(scratch, "store")), nprocs=world_size)


if __name__ == "__main__":
    main()
