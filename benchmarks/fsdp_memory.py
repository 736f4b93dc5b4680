"""Sharded data parallel on gloo ranks (notebook 08): what DDP and FSDP2 ranks hold, measured beside ZeRO's formula.

    python3 course.py python benchmarks/fsdp_memory.py [--width 1024] [--blocks 4] [--batch 64] [--steps 5]

A benchmark, not a test: it prints a table. Two ranks start with course_lib.dist.launch (gloo on the CPU; NCCL
where each rank has a GPU). The model is an MLP of `blocks` Linear(width, width) + ReLU blocks and a Linear(width,
10) head (4.2M parameters by default), trained with Adam in fp32 three ways: DDP; FSDP2 with fully_shard on each
block, then the root; FSDP2 on the root only. After the steps each rank measures its parameters, gradients and
Adam's state with course_lib.parallel.sharding.per_rank_state_bytes (a DTensor counts its local shard), beside
zero_memory's prediction in fp32 (4 bytes of parameter, 4 of gradient, K = 8 for Adam's two moments): stage 0 for
DDP, stage 3 for FSDP2. Both FSDP2 layouts hold the same shards between steps; they differ in what is all-gathered
at once during forward and backward ("largest gather", course_lib.parallel.sharding.largest_unshard_bytes: the
unsharded parameters of the biggest fully_shard group), which is what the root-only layout gives away: the whole
model at once, as if unsharded, with its full gradients until the one reduce-scatter at the end of backward. The
peak of one more step is measured by torch.distributed._tools' FSDPMemTracker (MemTracker for DDP), a
TorchDispatchMode that counts every live tensor's bytes (a private torch tool): root only, the peak is DDP's less
the half of Adam's state it does not hold; per block, the shards plus about one block. The step time is the
median over the timed steps (after one warm-up step) of the slowest rank, between barriers; on the CPU it says
little about a GPU, where FSDP2's all-gathers overlap with compute.
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

from course_lib.dist import choose_backend, launch  # noqa: E402
from course_lib.tables import print_table  # noqa: E402

RANKS = 2
LAYOUTS = ("DDP", "FSDP2 per block + root", "FSDP2 root only")


def _rank(rank, world_size, width, blocks, batch, steps):
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    from course_lib.dist import rank_device
    from course_lib.parallel.sharding import largest_unshard_bytes, per_rank_state_bytes

    device = rank_device()

    def mlp():
        torch.manual_seed(0)
        layers = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)]
        return nn.Sequential(*layers, nn.Linear(width, 10)).to(device)

    results = {}
    for layout in LAYOUTS:
        model = mlp()
        if layout == "DDP":
            model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        else:
            mesh = init_device_mesh(device.type, (world_size,))
            if layout == "FSDP2 per block + root":
                for block in model[:-1]:
                    fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)  # after wrapping: the sharded parameters
        generator = torch.Generator().manual_seed(rank)
        x = torch.randn(batch, width, generator=generator).to(device)
        y = torch.randint(0, 10, (batch,), generator=generator).to(device)
        times = []
        for step in range(steps + 1):
            dist.barrier()
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=False)
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's step
            if step:
                times.append(elapsed.item())
        if layout == "DDP":
            tracker = MemTracker()
            tracker.track_external(model, optimizer)
        else:
            tracker = FSDPMemTracker(model, optimizer)
        with tracker:                                     # one more step, every live tensor's bytes counted
            optimizer.zero_grad(set_to_none=False)
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        peak = max(snapshot["Total"] for snapshot in tracker.get_tracker_snapshot("peak").values())
        results[layout] = {**per_rank_state_bytes(model, optimizer), "step_s": statistics.median(times),
                           "gather": largest_unshard_bytes(model), "peak": peak,
                           "numel": sum(p.numel() for p in mlp().parameters()),
                           "adam_steps": 4 * len(list(model.parameters()))}
        del model, optimizer
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64, help="rows per rank per step")
    parser.add_argument("--steps", type=int, default=5, help="timed steps, after one warm-up step")
    args = parser.parse_args(argv)

    from course_lib.parallel.sharding import zero_memory

    backend, why = choose_backend(RANKS)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{RANKS} ranks, {backend} ({why}); {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, load average {load:.1f}")
    start = time.perf_counter()
    results = launch(_rank, RANKS, args.width, args.blocks, args.batch, args.steps, quiet=True, timeout=300)
    numel = results[0]["DDP"]["numel"]
    print(f"MLP: {args.blocks} × Linear({args.width}, {args.width}) + ReLU, then Linear({args.width}, 10): "
          f"{numel:,} parameters ({4 * numel / 2**20:.1f} MiB in fp32); Adam; batch {args.batch} per rank")
    predicted = zero_memory(numel, RANKS, stages=(0, 3), k=8, param_bytes=4, grad_bytes=4)
    mib = 2**20
    rows = []
    for layout in LAYOUTS:
        worst = max(results, key=lambda r: r[layout]["total"])[layout]  # the rank holding most (shards can differ)
        stage = 0 if layout == "DDP" else 3
        p = predicted[stage]
        rows.append([layout, f"{worst['params'] / mib:.2f} ({p['params'] / mib:.2f})",
                     f"{worst['grads'] / mib:.2f} ({p['grads'] / mib:.2f})",
                     f"{worst['optimizer'] / mib:.2f} ({p['optimizer'] / mib:.2f})",
                     f"{worst['total'] / mib:.2f} ({p['total'] / mib:.2f})",
                     f"{worst['gather'] / mib:.2f}" if worst["gather"] else "-",
                     f"{max(r[layout]['peak'] for r in results) / mib:.2f}",
                     f"{1e3 * max(r[layout]['step_s'] for r in results):.1f}"])
    print_table(["layout", "params MiB (ZeRO)", "grads MiB (ZeRO)", "Adam state MiB (ZeRO)", "total MiB (ZeRO)",
                 "largest gather MiB", "peak MiB", "step ms"], rows)
    print(f"Measured on the rank holding most, with zero_memory's prediction in brackets (DDP: stage 0; FSDP2: "
          f"stage 3; fp32, K = 8). Adam's state also holds one 4-byte step per parameter tensor "
          f"({results[0]['DDP']['adam_steps']} bytes), not sharded. Activations and the all-gathered layers during "
          f"forward and backward are not in these columns, but are in the peak (the rank with the highest, "
          f"measured by FSDPMemTracker). {time.perf_counter() - start:.1f} s in all.")


if __name__ == "__main__":
    main()
