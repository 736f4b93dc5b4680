"""Counting the bytes training holds: tensors, what autograd saves, what a graph keeps alive (notebook 01).

    tensor_bytes(tensors)                 numel() * element_size(), summed
    saved_activation_bytes(model, *x)     the distinct tensors autograd saves in model(*x), parameters left out
    graph_memory(t, exclude)              (nodes, saved bytes) still reachable from t.grad_fn
    rss_mib()                             this process's resident set size, from /proc (None elsewhere)
"""

from __future__ import annotations

import os
from typing import Iterable

import torch

__all__ = ["tensor_bytes", "saved_activation_bytes", "graph_memory", "rss_mib"]

MiB = 2**20


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the given tensors' elements: the sum of numel() * element_size() (notebook 01)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def saved_activation_bytes(model: torch.nn.Module, *inputs) -> int:
    """Bytes of the distinct tensors autograd saves during `model(*inputs)`, parameters left out (notebook 01).

    Two ops often save the same tensor (a ReLU's output is the next Linear's input): each storage counts once.
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t  # keep the tensor itself: we only look

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs)
    return sum(saved.values())


def graph_memory(t: torch.Tensor, exclude: Iterable[torch.Tensor] = ()) -> tuple[int, int]:
    """(graph nodes, bytes of saved tensors) reachable from `t.grad_fn`, tensors in `exclude` left out (notebook 01)."""
    skip = {p.untyped_storage().data_ptr() for p in exclude}
    nodes, storages = set(), {}
    stack = [t.grad_fn] if torch.is_tensor(t) else []
    while stack:
        node = stack.pop()
        if node is None or node in nodes:
            continue
        nodes.add(node)
        for name in dir(node):
            if name.startswith("_saved_") and torch.is_tensor(value := getattr(node, name)):
                if value.untyped_storage().data_ptr() not in skip:
                    storages[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
        stack.extend(fn for fn, _ in node.next_functions)
    return len(nodes), sum(storages.values())


def rss_mib() -> float | None:
    """Resident set size of this process in MiB, from /proc (Linux); None where there is no /proc (notebook 01)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MiB
    except (OSError, ValueError):
        return None
