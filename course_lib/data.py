"""Synthetic data sets and untrained models: everything a lesson trains on, with nothing to download (notebook 01).

    make_classification(n, features, classes, seed)   a learnable task labelled by a random teacher network
    fake_images(n, image_size, num_classes)           torchvision FakeData as tensors
    small_mlp(features, hidden, classes, depth)       a plain MLP
    untrained_resnet(name, num_classes)               a torchvision ResNet with random weights
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

__all__ = ["make_classification", "fake_images", "small_mlp", "untrained_resnet"]


def _positive_int(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a whole number, 1 or more, not {value!r}")
    return value


def make_classification(n: int = 4096, features: int = 32, classes: int = 10, seed: int = 0,
                        hidden: int = 64) -> TensorDataset:
    """`n` random inputs labelled by a fixed random teacher MLP: a task a small model can learn (notebook 01).

    Inputs are standard normal, float32, shape (n, features); labels are int64 in [0, classes).
    The same seed gives the same data set on every machine and in every rank.
    """
    for name, value in (("n", n), ("features", features), ("classes", classes), ("hidden", hidden)):
        _positive_int(name, value)
    generator = torch.Generator().manual_seed(seed)  # private generator: leaves the global RNG alone
    x = torch.randn(n, features, generator=generator)
    w1 = torch.randn(features, hidden, generator=generator) / features**0.5
    w2 = torch.randn(hidden, classes, generator=generator) / hidden**0.5
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)  # teacher: a smooth function, so the labels are learnable
    return TensorDataset(x, y)


def fake_images(n: int = 256, image_size: int | tuple[int, int, int] = 32, num_classes: int = 10,
                seed: int = 0) -> Dataset:
    """`n` random images as float tensors (C, H, W) in [0, 1] with int labels, via torchvision FakeData (notebook 01).

    Random pixels carry no signal: use this to measure speed and memory, not accuracy.
    """
    from torchvision import datasets, transforms

    _positive_int("n", n)
    size = (3, image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    return datasets.FakeData(size=n, image_size=size, num_classes=num_classes,
                             transform=transforms.ToTensor(), random_offset=seed)


def small_mlp(features: int = 32, hidden: int = 128, classes: int = 10, depth: int = 2) -> nn.Sequential:
    """An MLP: `depth` hidden Linear+ReLU layers of width `hidden`, then a Linear to `classes` logits (notebook 01)."""
    for name, value in (("features", features), ("hidden", hidden), ("classes", classes), ("depth", depth)):
        _positive_int(name, value)
    layers: list[nn.Module] = []
    width = features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def untrained_resnet(name: str = "resnet18", num_classes: int = 10) -> nn.Module:
    """A torchvision ResNet with random weights (weights=None: nothing is downloaded) (notebook 01)."""
    from torchvision import models

    choices = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
    if name not in choices:
        raise ValueError(f"name must be one of {', '.join(choices)}, not {name!r}")
    return getattr(models, name)(weights=None, num_classes=num_classes)
