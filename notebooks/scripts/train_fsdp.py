"""Lesson 08's script: an MLP trained with FSDP2, checkpointed with DCP, resumable, on one machine or several.

    python3 course.py torchrun --standalone --nproc-per-node=2 notebooks/scripts/train_fsdp.py --out build/fsdp.pt

    # two "machines" on one laptop: run each line in its own terminal (the same port, a free one)
    python3 course.py torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \
        --rdzv-endpoint 127.0.0.1:29400 --rdzv-id demo notebooks/scripts/train_fsdp.py --print-env

    # an elastic restart: rank 1 dies once at step 7, torchrun restarts every rank, they resume from step 5
    python3 course.py torchrun --standalone --nproc-per-node 2 --max-restarts 1 notebooks/scripts/train_fsdp.py \
        --checkpoint-every 5 --crash-at-step 7 --crash-rank 1

Each block of the MLP gets fully_shard, then the root (bottom-up, as FSDP2's docstring asks); the optimizer is made
after sharding, from the sharded parameters. The data are synthetic and deterministic: one global batch per step,
drawn from the step's own seed, and rank r of W takes rows r, r + W, r + 2W, ... (DistributedSampler's split), so
the result depends on the world size, never on how ranks are placed on machines or on a restart. Every
--checkpoint-every steps the model and optimizer (get_state_dict: sharded, DTensors) and the step are saved with
torch.distributed.checkpoint into --checkpoint-dir/step_NNNNNN; at start the latest complete one (with its
.metadata, which rank 0 writes last) is loaded: delete the folder to start afresh. Gloo on the CPU, or NCCL with
one GPU per LOCAL_RANK. Nothing goes to stderr unless something fails.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
       "TORCHELASTIC_RESTART_COUNT")
CHECKPOINTS = Path(__file__).resolve().parents[2] / "build" / "checkpoints" / "train_fsdp"  # build/: not in git


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps in all")
    parser.add_argument("--batch-size", type=int, default=32, help="rows per step, over all ranks together")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=3, help="Linear + ReLU blocks, each sharded on its own")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir", default=str(CHECKPOINTS),
                        help="where checkpoints go, and are resumed from: delete it to start afresh")
    parser.add_argument("--checkpoint-every", type=int, default=5, help="0: never")
    parser.add_argument("--out", default=None, help="rank 0 saves the full trained parameters here (torch.save)")
    parser.add_argument("--print-env", action="store_true", help="each rank prints what torchrun told it")
    parser.add_argument("--crash-at-step", type=int, default=None,
                        help="kill one rank at the start of this step, in the first run only (restart count 0)")
    parser.add_argument("--crash-rank", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.checkpoint_every < 0:
        parser.error("--steps and --batch-size must be 1 or more, --checkpoint-every 0 or more")
    return args


def make_model(width: int, blocks: int, seed: int) -> nn.Sequential:
    """The same initial weights on every rank (fully_shard keeps each rank's slice of them)."""
    torch.manual_seed(seed)
    layers = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def global_batch(step: int, batch_size: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s whole batch, the same on every rank and in every run: a noisy linear target to learn."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(batch_size, width, generator=generator)
    w = torch.linspace(-1, 1, width, dtype=torch.float32)
    y = (x @ w).unsqueeze(1).tanh() + 0.1 * torch.randn(batch_size, 1, generator=generator)
    return x, y


def latest_checkpoint(folder: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint: a step_NNNNNN folder with its .metadata (written last, by rank 0)."""
    found = [(int(m.group(1)), p) for p in folder.glob("step_*")
             if (m := re.fullmatch(r"step_(\d+)", p.name)) and (p / ".metadata").exists()]
    return max(found) if found else None


def save(folder: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model_state, optim_state = get_state_dict(model, optimizer)  # sharded: each rank writes its own shards
    dcp.save({"model": model_state, "optim": optim_state, "progress": {"step": step}},
             checkpoint_id=str(folder / f"step_{step:06d}"))


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, "progress": {"step": 0}}
    dcp.load(state, checkpoint_id=str(path))  # in place, into this rank's shards
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["progress"]["step"])


def train(args: argparse.Namespace, device: torch.device) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world:
        raise ValueError(f"--batch-size {args.batch_size} does not split over {world} ranks")
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.print_env:
        # One write per line: print() writes the text and the newline separately when output is unbuffered, and
        # the ranks share torchrun's output, so two ranks' lines could interleave on one line.
        sys.stdout.write("env " + " ".join(f"{name}={os.environ.get(name, '-')}" for name in ENV) + "\n")
        sys.stdout.flush()

    mesh = init_device_mesh(device.type, (world,))
    model = make_model(args.width, args.blocks, args.seed).to(device)
    for block in model[:-1]:
        fully_shard(block, mesh=mesh)           # each block: its own all-gather and reduce-scatter
    fully_shard(model, mesh=mesh)               # then the root (the last Linear goes with it)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)   # after fully_shard: the sharded parameters

    folder = Path(args.checkpoint_dir)
    first = 0
    found = latest_checkpoint(folder) if args.checkpoint_every else None
    if found is not None:
        first = load(found[1], model, optimizer)
        if rank == 0:
            print(f"resumed from {found[1].name} (step {first}), restart {restart}", flush=True)

    loss = torch.zeros((), device=device)
    for step in range(first, args.steps):
        if step == args.crash_at_step and rank == args.crash_rank and restart == 0:
            print(f"rank {rank}: crashing on purpose at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)   # as abrupt as a lost machine: no cleanup at all
        x, y = global_batch(step, args.batch_size, args.width, args.seed)
        x, y = x[rank::world].to(device), y[rank::world].to(device)   # this rank's rows
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()                         # reduce-scatter: each rank gets its shard of the mean gradient
        optimizer.step()
        done = step + 1
        if args.checkpoint_every and done % args.checkpoint_every == 0 and done < args.steps:
            save(folder, done, model, optimizer)
            if rank == 0:
                print(f"step {done}: checkpoint {folder.name}/step_{done:06d}", flush=True)

    mean = loss.detach().clone()
    dist.all_reduce(mean, op=dist.ReduceOp.AVG)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:                               # every rank took part in gathering; rank 0 alone writes
        print(f"done: {args.steps} steps, last loss {mean.item():.4f}, {world} ranks", flush=True)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            torch.save(full, args.out)
    dist.barrier()                              # the file is there before any rank leaves; all leave together


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    local_rank = int(os.environ["LOCAL_RANK"])   # torchrun sets it, and RANK, WORLD_SIZE, ...
    if torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):
        device = torch.device("cuda", local_rank)   # one GPU per process, by its number on this machine
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=dist.get_default_backend_for_device(device),
                            device_id=device if device.type == "cuda" else None,
                            timeout=timedelta(seconds=float(os.environ.get("TRAIN_FSDP_TIMEOUT_S", 120))))
    try:
        train(args, device)
    finally:
        dist.destroy_process_group()             # even if train raised: leave no rank waiting


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown. After all its work (the process group destroyed, every file
    # written), a rank aborted at exit in about 2 % of runs with "terminate called without an active exception"
    # (SIGABRT, torch 2.14.1, gloo; measured while writing the course's multi-node tests): a C++ thread still
    # joinable when its object is destroyed. Nothing is left to do but flush what was printed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
