"""Lesson 05's script: ResNet-18 on synthetic images with DistributedDataParallel.

    python3 course.py torchrun --standalone --nproc-per-node=2 notebooks/scripts/train_ddp.py

train_single.py beside it is the same program on one device: notebook 05 prints the diff
between the two files, and runs `train` below in ranks started by course_lib.dist.launch too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, fields
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from tqdm.auto import tqdm

CHECKPOINTS = Path(__file__).resolve().parents[2] / "build" / "checkpoints"  # build/: not in git


@dataclass
class Config:
    epochs: int = 2
    steps: int = 10                 # optimizer steps per epoch
    batch_size: int = 32            # images per step, in each process
    image_size: int = 32            # pixels per side
    lr: float = 0.02
    seed: int = 0
    checkpoint: str = str(CHECKPOINTS / f"{Path(__file__).stem}.pt")
    resume: bool = False            # start from the checkpoint, if there is one
    metrics: str = str(CHECKPOINTS / f"{Path(__file__).stem}.json")   # losses and step times


def synthetic_images(n: int, size: int, classes: int = 10, seed: int = 0) -> TensorDataset:
    """n images (3, size, size): a fixed random pattern per class under noise, to be learnt."""
    generator = torch.Generator().manual_seed(seed)
    patterns = torch.randn(classes, 3, size, size, generator=generator)
    labels = torch.randint(0, classes, (n,), generator=generator)
    images = 0.3 * patterns[labels] + torch.randn(n, 3, size, size, generator=generator)
    return TensorDataset(images, labels)


def train(cfg: Config) -> dict:
    """Train in this process, one of many; return its log: each step's loss and seconds."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])   # the process's number on its machine
    nccl = "nccl" in str(dist.get_backend())
    device = torch.device("cuda", local_rank) if nccl else torch.device("cpu")
    torch.manual_seed(cfg.seed)                  # (DDP broadcasts rank 0's weights anyway)
    model = torchvision.models.resnet18(num_classes=10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    first_epoch = 0
    if cfg.resume and os.path.exists(cfg.checkpoint):
        # map_location: onto this rank's device, not the one rank 0 saved from
        state = torch.load(cfg.checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_epoch = state["epoch"] + 1
    model = DDP(model, device_ids=[local_rank] if nccl else None)

    # Each process keeps its batch size: the data grows with the world (weak scaling).
    size = cfg.steps * cfg.batch_size * world_size
    data = synthetic_images(size, cfg.image_size, seed=cfg.seed)
    sampler = DistributedSampler(data, world_size, rank, shuffle=True, seed=cfg.seed)
    loader = DataLoader(data, batch_size=cfg.batch_size, sampler=sampler, drop_last=True)

    log = {"loss": [], "step_s": [], "processes": world_size, "batch_size": cfg.batch_size}
    for epoch in range(first_epoch, cfg.epochs):
        sampler.set_epoch(epoch)                 # a new shuffle each epoch, the same on all ranks
        quiet = rank != 0 or not sys.stderr.isatty()   # a bar in a terminal, from rank 0
        bar = tqdm(loader, desc=f"epoch {epoch}", disable=quiet)
        for images, labels in bar:
            start = time.perf_counter()
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()                      # averages the gradients over the ranks
            optimizer.step()
            mean_loss = loss.detach().clone()    # every rank all-reduces; only rank 0 prints
            dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
            log["loss"].append(mean_loss.item())    # waits for the device: the step is done
            log["step_s"].append(time.perf_counter() - start)
        if rank == 0:
            last = log["loss"][-1]
            print(f"epoch {epoch}: loss {last:.3f} at step {len(log['loss'])}", flush=True)
            os.makedirs(os.path.dirname(cfg.checkpoint), exist_ok=True)
            # model.module: the model itself, so that the keys have no "module." prefix
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                     "epoch": epoch}
            torch.save(state, cfg.checkpoint)
        dist.barrier()                           # nobody reads it before rank 0 has written it
    return log


def parse_args(argv: list[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in fields(Config):
        if isinstance(field.default, bool):
            parser.add_argument(f"--{field.name}", action="store_true")
        else:
            kind = type(field.default)
            parser.add_argument(f"--{field.name}", type=kind, default=field.default)
    return Config(**vars(parser.parse_args(argv)))


def main() -> None:
    cfg = parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])   # torchrun sets it, and RANK, WORLD_SIZE, ...
    if torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):   # one GPU per process
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)            # before init: NCCL binds us to our GPU
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=dist.get_default_backend_for_device(device),
                            device_id=device if device.type == "cuda" else None,
                            timeout=timedelta(minutes=5))
    try:
        log = train(cfg)
        if cfg.metrics and dist.get_rank() == 0:
            os.makedirs(os.path.dirname(cfg.metrics), exist_ok=True)
            with open(cfg.metrics, "w") as file:
                json.dump({"config": asdict(cfg), **log}, file)
    finally:
        dist.destroy_process_group()             # even if train raised: leave no rank waiting


if __name__ == "__main__":
    main()
