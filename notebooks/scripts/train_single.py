"""Lesson 05's starting point: ResNet-18 on synthetic images, on one device.

    python notebooks/scripts/train_single.py --epochs 2

train_ddp.py beside it is the same program made distributed: notebook 05 prints the diff
between the two files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

CHECKPOINTS = Path(__file__).resolve().parents[2] / "build" / "checkpoints"  # build/: not in git


@dataclass
class Config:
    epochs: int = 2
    steps: int = 10                 # optimizer steps per epoch
    batch_size: int = 32            # images per step
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
    """Train; return the log: the loss and the seconds of every step."""
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(cfg.seed)
    model = torchvision.models.resnet18(num_classes=10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    first_epoch = 0
    if cfg.resume and os.path.exists(cfg.checkpoint):
        state = torch.load(cfg.checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_epoch = state["epoch"] + 1

    size = cfg.steps * cfg.batch_size
    data = synthetic_images(size, cfg.image_size, seed=cfg.seed)
    loader = DataLoader(data, batch_size=cfg.batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(cfg.seed))

    log = {"loss": [], "step_s": [], "processes": 1, "batch_size": cfg.batch_size}
    for epoch in range(first_epoch, cfg.epochs):
        quiet = not sys.stderr.isatty()               # a bar in a terminal
        bar = tqdm(loader, desc=f"epoch {epoch}", disable=quiet)
        for images, labels in bar:
            start = time.perf_counter()
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            log["loss"].append(loss.item())         # waits for the device: the step is done
            log["step_s"].append(time.perf_counter() - start)
        last = log["loss"][-1]
        print(f"epoch {epoch}: loss {last:.3f} at step {len(log['loss'])}", flush=True)
        os.makedirs(os.path.dirname(cfg.checkpoint), exist_ok=True)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "epoch": epoch}
        torch.save(state, cfg.checkpoint)
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
    log = train(cfg)
    if cfg.metrics:
        os.makedirs(os.path.dirname(cfg.metrics), exist_ok=True)
        with open(cfg.metrics, "w") as file:
            json.dump({"config": asdict(cfg), **log}, file)


if __name__ == "__main__":
    main()
