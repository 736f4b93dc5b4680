"""The course's MiniDDP (solutions/ex05_ddp.py) against torch's DistributedDataParallel: time per training step.

    python3 course.py python benchmarks/ddp_step.py [--ranks 2] [--caps 1 5 25 100] [--width 1024] [--depth 8] [--batch 64]

A benchmark, not a test: it prints a table of median step times. Ranks start with course_lib.dist.launch
(gloo ranks on a CPU-only machine, NCCL where each rank has a GPU); each rank loads the reference solution
itself with course_lib.grading.runner.load_exercise_file. One step is zero_grad, forward, MSE loss,
backward, (MiniDDP: finish_gradient_synchronization), SGD step, on an MLP of `depth` Linear(width, width)
layers with this rank's batch. For each bucket_cap_mb, MiniDDP and torch's DDP (same cap, its other options
left at their defaults) train identical copies of the model, interleaved step by step in alternating order so
that a noisy moment costs both alike; a third column times the same step with no communication at all (what
overlap could hide the all-reduces behind). Each time is the slowest rank's, after a barrier; the median over
repetitions is reported, after warm-up steps (torch's DDP rebuilds its buckets after the first iteration).
torch's DDP with an explicit bucket_cap_mb uses it for the first bucket too (torch 2.14); MiniDDP's first
bucket is min(1, bucket_cap_mb) MiB, so the bucket counts may differ by one.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_lib.devices import usable_cores  # noqa: E402
from course_lib.dist import choose_backend, launch, rank_device  # noqa: E402
from course_lib.tables import print_table  # noqa: E402

SOLUTION = ROOT / "solutions" / "ex05_ddp.py"


def _bench_rank(rank: int, world_size: int, solution_path: str, caps, width: int, depth: int, batch: int,
                repeats: int, warmup: int):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    from course_lib.grading.runner import load_exercise_file

    solution = load_exercise_file(solution_path)
    device = rank_device()

    def make_model():
        torch.manual_seed(0)
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*layers[:-1]).to(device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, width, generator=generator).to(device)
    y = torch.randn(batch, width, generator=generator).to(device)
    results = {}
    for cap in caps:
        plain = make_model()
        mini = solution.MiniDDP(make_model(), bucket_cap_mb=cap)
        theirs = nn.parallel.DistributedDataParallel(make_model(), bucket_cap_mb=cap,
                                                     device_ids=[device.index] if device.type == "cuda" else None)
        optimizers = {name: torch.optim.SGD(model.parameters(), lr=1e-4)
                      for name, model in (("compute only", plain), ("MiniDDP", mini), ("torch DDP", theirs))}

        def step(name, model):
            optimizers[name].zero_grad()
            F.mse_loss(model(x), y).backward()
            if name == "MiniDDP":
                model.finish_gradient_synchronization()
            optimizers[name].step()

        models = {"MiniDDP": mini, "torch DDP": theirs, "compute only": plain}
        times = {name: [] for name in models}
        for i in range(warmup + repeats):
            order = list(models) if i % 2 == 0 else list(reversed(models))
            for name in order:
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                step(name, models[name])
                sync()
                if i >= warmup:
                    times[name].append(time.perf_counter() - t0)
        # Same answer first: both wrappers must have trained the same model (a fast wrong DDP is not worth timing).
        for a, b in zip(mini.module.parameters(), theirs.module.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        sizes = [p.numel() * p.element_size() for p in mini.module.parameters() if p.requires_grad]
        buckets = len(solution.bucket_assignment(sizes, cap, min(1.0, cap)))
        results[cap] = {"times": times, "buckets": buckets, "bytes": sum(sizes)}
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--caps", type=float, nargs="+", default=[1.0, 5.0, 25.0, 100.0], help="bucket_cap_mb values")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="rows per rank")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    options = parser.parse_args(argv)

    import torch

    backend, why = choose_backend(options.ranks)
    print(f"MiniDDP (solutions/ex05_ddp.py) against torch's DistributedDataParallel: one training step of an MLP of "
          f"{options.depth} Linear({options.width}, {options.width}), {options.batch} rows per rank; median of "
          f"{options.repeats} after {options.warmup} warm-up; slowest rank per step")
    print(f"torch {torch.__version__}, Python {platform.python_version()}, {usable_cores()} usable CPU cores; "
          f"{options.ranks} ranks: {why}")
    per_rank = launch(_bench_rank, options.ranks, str(SOLUTION), options.caps, options.width, options.depth,
                      options.batch, options.repeats, options.warmup, quiet=True, timeout=1800)
    rows = []
    for cap in options.caps:
        medians = {}
        for name in ("MiniDDP", "torch DDP", "compute only"):
            slowest = [max(r[cap]["times"][name][i] for r in per_rank) for i in range(options.repeats)]
            medians[name] = statistics.median(slowest)
        info = per_rank[0][cap]
        rows.append([f"{cap:g}", info["buckets"], f"{info['bytes'] / 2**20:.1f} MiB",
                     f"{medians['compute only'] * 1e3:.1f}", f"{medians['MiniDDP'] * 1e3:.1f}",
                     f"{medians['torch DDP'] * 1e3:.1f}", f"{medians['torch DDP'] / medians['MiniDDP']:.2f}"])
    print_table(["bucket_cap_mb", "MiniDDP buckets", "gradients", "compute only ms", "MiniDDP ms", "torch DDP ms",
                 "torch / MiniDDP"], rows)
    print("torch / MiniDDP above 1: MiniDDP's step is faster; the course's goal is at least 0.9.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
