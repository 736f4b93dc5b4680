"""Pipeline parallelism on gloo ranks (notebook 07): torch.distributed.pipelining's GPipe and 1F1B against no split.

    python3 course.py python benchmarks/pipeline_step.py [--micro-batches 1 2 4 8] [--width 1024] [--batch 512]

A benchmark, not a test: it prints a table of median step times. Two ranks start with course_lib.dist.launch
(gloo on the CPU; NCCL where each rank has a GPU). The model is an MLP of 8 Linear(width, width) layers (ReLU
between), cut by hand into 4 + 4 layers (course_lib.parallel.pipeline.split_by_boundaries), each rank wrapping its
half in a PipelineStage (the manual split of the pipelining tutorial). One step is zero_grad, then schedule.step
(rank 0 gives the inputs, rank 1 the targets; MSE loss per micro-batch, gradients averaged over micro-batches,
torch's default scale_grads=True), for ScheduleGPipe and Schedule1F1B at each number of micro-batches m (a fresh
stage and schedule each time: a stage's buffers are shaped by its first micro-batch). Beside them: the same step
unsplit, the whole model forward, loss and backward in rank 0 alone (with the same torch threads as a stage, while
rank 1 waits), and the GPipe prediction for 2 equal stages and no communication cost: unsplit × (m + p − 1)/(p·m),
whose idle share is the bubble (p − 1)/(m + p − 1). Each time is the slowest rank's, between two barriers; the
median over repeats is reported, after warm-up steps. Before timing, each schedule's step is checked against the
unsplit model: the mean of the micro-batch losses must equal the full-batch loss, and each stage's gradients the
unsplit model's (torch.testing.assert_close, float32 tolerances).

On a 2-core machine each rank gets one core (course_lib.dist gives each rank cores // ranks torch threads), so two
CPU "stages" really run side by side, if nothing else is running (the header gives the load average: other work
on the cores takes the overlap away); with m = 1 one of them always waits. torch's Schedule1F1B refuses m < p.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_lib.devices import usable_cores  # noqa: E402
from course_lib.dist import choose_backend, launch  # noqa: E402
from course_lib.tables import print_table  # noqa: E402

STAGES = 2  # ranks, each one stage
LAYERS = 8


def _model(width: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(LAYERS - 1)]
    return nn.Sequential(*blocks, nn.Linear(width, width))


def _bench_rank(rank: int, world_size: int, width: int, batch: int, micro_batches, repeats: int, warmup: int):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from course_lib.dist import rank_device
    from course_lib.parallel.pipeline import split_by_boundaries

    device = rank_device()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(batch, width, generator=generator).to(device)
    y = torch.randn(batch, width, generator=generator).to(device)

    # The unsplit step, on rank 0 alone; its loss and gradients are the reference for every schedule.
    full = _model(width).to(device)
    loss = F.mse_loss(full(x), y)
    loss.backward()
    reference_loss = loss.item()
    reference_grads = [p.grad.clone() for p in split_by_boundaries(full, [LAYERS // 2])[rank].parameters()]
    unsplit = []
    for i in range(warmup + repeats):
        dist.barrier()
        if rank == 0:
            sync()
            t0 = time.perf_counter()
            full.zero_grad()
            F.mse_loss(full(x), y).backward()
            sync()
            if i >= warmup:
                unsplit.append(time.perf_counter() - t0)
        dist.barrier()

    results = {"unsplit": unsplit, "reference_loss": reference_loss}
    for name, schedule_class in (("GPipe", ScheduleGPipe), ("1F1B", Schedule1F1B)):
        for m in micro_batches:
            piece = split_by_boundaries(_model(width), [LAYERS // 2])[rank].to(device)
            stage = PipelineStage(piece, rank, world_size, device)
            try:
                schedule = schedule_class(stage, n_microbatches=m, loss_fn=F.mse_loss)
            except ValueError as error:  # Schedule1F1B: "Number of microbatches (1) must be greater than or equal..."
                results[(name, m)] = {"refused": str(error).split(".")[0]}
                continue

            def step():
                piece.zero_grad()
                losses = []
                if rank == 0:
                    schedule.step(x)
                else:
                    schedule.step(target=y, losses=losses)
                return losses

            losses = step()  # checked before it is timed
            grads_error = max((p.grad - g).abs().max().item() for p, g in zip(piece.parameters(), reference_grads))
            for p, g in zip(piece.parameters(), reference_grads):
                torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
            loss_value = torch.stack(losses).mean().item() if losses else None
            if losses:  # the last stage: the mean micro-batch loss is the full batch's (equal micro-batches)
                torch.testing.assert_close(loss_value, reference_loss, rtol=1e-5, atol=1e-7)
            times = []
            for i in range(warmup + repeats):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                step()
                sync()
                elapsed = time.perf_counter() - t0
                if i >= warmup:
                    times.append(elapsed)
            results[(name, m)] = {"times": times, "loss": loss_value, "grads_error": grads_error}
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=512, help="rows per step, split into micro-batches")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    options = parser.parse_args(argv)
    for m in options.micro_batches:
        if m < 1 or options.batch % m:
            parser.error(f"--batch {options.batch} must split into {m} equal micro-batches: torch's pipelining shapes "
                         "its buffers by the first micro-batch, and a shorter last one fails in backward")

    import torch

    from course_lib.parallel.pipeline import gpipe_bubble

    backend, why = choose_backend(STAGES)
    layer = f"Linear({options.width}, {options.width})"
    print(f"torch.distributed.pipelining, {STAGES} stages of {LAYERS // STAGES} {layer} "
          f"layers, batch {options.batch}; median of {options.repeats} after {options.warmup} warm-up, slowest rank")
    load = f"; load average {os.getloadavg()[0]:.2f} before the run" if hasattr(os, "getloadavg") else ""
    print(f"torch {torch.__version__}, Python {platform.python_version()}, {usable_cores()} usable CPU cores{load}")
    print(f"{STAGES} ranks: {why}")
    started = time.perf_counter()
    per_rank = launch(_bench_rank, STAGES, options.width, options.batch, options.micro_batches, options.repeats,
                      options.warmup, quiet=True, timeout=600)
    unsplit = statistics.median(per_rank[0]["unsplit"])
    reference_loss = per_rank[0]["reference_loss"]
    rows, checks = [], []
    for m in options.micro_batches:
        predicted = unsplit * (m + STAGES - 1) / (STAGES * m)
        row = [m, options.batch // m, f"{unsplit * 1e3:.1f}"]
        for name in ("GPipe", "1F1B"):
            result = [r[(name, m)] for r in per_rank]
            if "refused" in result[0]:
                row.append("refused (m < p)")
                continue
            slowest = [max(r["times"][i] for r in result) for i in range(options.repeats)]
            row.append(f"{statistics.median(slowest) * 1e3:.1f}")
            last = result[STAGES - 1]
            checks.append(f"{name} m={m}: loss {last['loss']:.6f} (unsplit {reference_loss:.6f}), "
                          f"max |grad − unsplit| {max(r['grads_error'] for r in result):.1e}")
        row += [f"{predicted * 1e3:.1f}", f"{gpipe_bubble(STAGES, m):.0%}"]
        rows.append(row)
    print_table(["m", "rows per micro-batch", "unsplit ms", "GPipe ms", "1F1B ms", "GPipe predicted ms",
                 "bubble (p-1)/(m+p-1)"], rows)
    print("predicted: unsplit × (m+p−1)/(p·m), 2 equal stages, no communication or per-micro-batch cost")
    print("same answer as the unsplit model (checked before timing; losses: the mean over micro-batches):")
    for line in checks:
        print("  " + line)
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
