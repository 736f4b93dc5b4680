"""The course's ring all-reduce (solutions/ex04_collectives.py) against the backend's own all_reduce.

    python benchmarks/ring_allreduce.py [--ranks 2 4] [--repeats 10]

A benchmark, not a test: it prints a table of median times, their ratio, and bus bandwidth as
nccl-tests defines it (notebook 04, section 6). Ranks start with course_lib.dist.launch, so this
compares against gloo on a CPU-only machine and against NCCL where each rank has a GPU. Both
sides include one copy of the input (the ring works on a copy; the built-in runs in place on a
clone), so neither gets that for free. Each time is the slowest rank's, per repetition, after a
barrier; the two are interleaved, and the median over repetitions is reported.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import statistics
import sys
import time
from pathlib import Path

import cloudpickle

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_lib.devices import usable_cores  # noqa: E402
from course_lib.dist import choose_backend, launch, rank_device  # noqa: E402
from course_lib.tables import print_table  # noqa: E402

SIZES = [2**8, 2**12, 2**16, 2**20, 2**22]  # float32 elements: 1 KiB .. 16 MiB


def load_solution():
    """The reference solution module, shipped to the ranks by value (it is not an installed package)."""
    path = ROOT / "solutions" / "ex04_collectives.py"
    spec = importlib.util.spec_from_file_location("ex04_collectives_reference", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


def _bench_rank(rank: int, world_size: int, ring, sizes, repeats: int, warmup: int):
    import torch
    import torch.distributed as dist

    device = rank_device()  # cuda:LOCAL_RANK under NCCL, else the CPU

    def builtin(x):
        y = x.clone()
        dist.all_reduce(y)
        return y

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    ops = {"ring": ring, "builtin": builtin}
    warm = torch.randn(max(sizes), device=device)
    for op in ops.values():  # first use of each sets up connections and buffers
        op(warm)
    times = {(name, numel): [] for name in ops for numel in sizes}
    for numel in sizes:
        x = torch.randn(numel, device=device)
        # Same answer first: a fast wrong all-reduce is not worth timing.
        torch.testing.assert_close(ring(x), builtin(x), rtol=1e-4, atol=1e-4)
        for i in range(warmup + repeats):
            # Interleaved, in alternating order, so that a noisy moment costs both sides alike.
            for name in (("ring", "builtin") if i % 2 == 0 else ("builtin", "ring")):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                ops[name](x)
                sync()
                if i >= warmup:
                    times[(name, numel)].append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    options = parser.parse_args(argv)

    solution = load_solution()
    import torch

    print(f"Ring all-reduce (solutions/ex04_collectives.py) against the built-in dist.all_reduce, float32 sum; "
          f"median of {options.repeats} after {options.warmup} warm-up; slowest rank per repetition")
    print(f"torch {torch.__version__}, Python {platform.python_version()}, {usable_cores()} usable CPU cores")
    rows = []
    for world_size in options.ranks:
        backend, why = choose_backend(world_size)
        print(f"{world_size} ranks: {why}")
        per_rank = launch(_bench_rank, world_size, solution.ring_all_reduce, SIZES, options.repeats,
                          options.warmup, quiet=True, timeout=600)
        for numel in SIZES:
            medians = {}
            for name in ("ring", "builtin"):
                slowest = [max(rank_times[(name, numel)][i] for rank_times in per_rank) for i in range(options.repeats)]
                medians[name] = statistics.median(slowest)
            size = numel * 4
            _, ring_bus = solution.bandwidths("all_reduce", size, medians["ring"], world_size)
            _, builtin_bus = solution.bandwidths("all_reduce", size, medians["builtin"], world_size)
            rows.append([world_size, backend, _human(size), f"{medians['ring'] * 1e3:.3f}",
                         f"{medians['builtin'] * 1e3:.3f}", f"{medians['ring'] / medians['builtin']:.2f}×",
                         f"{ring_bus:.3g}", f"{builtin_bus:.3g}"])
    print_table(["ranks", "backend", "size", "ring ms", "built-in ms", "ring / built-in", "ring busbw GB/s",
                 "built-in busbw GB/s"], rows)
    return 0


def _human(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:g} {unit}"
        size /= 1024
    return f"{size:g}"


if __name__ == "__main__":
    sys.exit(main())
