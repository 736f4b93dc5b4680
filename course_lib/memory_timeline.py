"""A memory timeline of a few training steps on the CPU: when parameters, activations, gradients and states appear.

    timeline = memory_timeline(model, optimizer, batches)   run one step per (x, y) batch, sampling after every op
    timeline.figure()                                        a stacked area plot, one band per kind of tensor
    timeline.at_marks()                                      {"forward 1": {"parameters": bytes, ...}, ...}

On a GPU, PyTorch's caching allocator records such a history itself (torch.cuda.memory._record_memory_history,
then _dump_snapshot for https://pytorch.org/memory_viz). On the CPU there is no such allocator, so this module
does the same accounting from the tensors: a TorchDispatchMode sees every tensor an operator makes, keeps a weak
reference to it, and after every operator adds up the distinct storages still alive, by kind (notebook 01).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["KINDS", "MemoryTimeline", "memory_timeline"]

# Bands of the plot, bottom to top.
KINDS = ["parameters", "optimizer states", "gradients", "batch", "saved for backward", "other temporaries"]
COLOURS = ["#0072B2", "#009E73", "#E69F00", "#999999", "#CC79A7", "#F0E442"]


@dataclass
class MemoryTimeline:
    """Live bytes by kind after every operator of a few training steps, and where each phase began (notebook 01)."""

    samples: list[dict[str, int]] = field(default_factory=list)
    marks: list[tuple[int, str]] = field(default_factory=list)  # (sample index, "forward 1"), ...

    def at_marks(self) -> dict[str, dict[str, int]]:
        """The bytes by kind at the moment each phase began."""
        return {label: self.samples[index] for index, label in self.marks if index < len(self.samples)}

    def peak(self) -> int:
        """The most bytes alive at once, all kinds together."""
        return max((sum(s.values()) for s in self.samples), default=0)

    def figure(self, unit: str = "MiB", title: str = ""):
        """A stacked area plot of the timeline, with the start of each phase marked."""
        from matplotlib.figure import Figure

        scale = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
        fig = Figure(figsize=(12, 4), layout="constrained")
        ax = fig.subplots()
        x = list(range(len(self.samples)))
        ax.stackplot(x, [[s.get(k, 0) / scale for s in self.samples] for k in KINDS], labels=KINDS,
                     colors=COLOURS, alpha=0.85)
        top = self.peak() / scale
        for index, label in self.marks:
            ax.axvline(index, color="black", linewidth=0.6, linestyle=":")
            ax.text(index, top * 1.02, f" {label}", rotation=90, va="bottom", ha="left", fontsize=8)
        ax.set(xlabel="operators run (one sample after each)", ylabel=f"live tensors ({unit})",
               ylim=(0, top * 1.35 if top else 1), xlim=(0, max(1, len(x) - 1)))
        ax.set_title(title or "Memory during training steps: what is alive, and when", fontsize=11)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
        return fig


class _Tracker(TorchDispatchMode):
    """Keeps a weak reference to every tensor an operator returns, and samples the live storages by kind."""

    @classmethod
    def _should_skip_dynamo(cls):
        return False  # the default wraps __torch_dispatch__ with torch._dynamo, whose import takes seconds

    def __init__(self, sample: Callable[[], None]):
        super().__init__()
        self.refs: list[weakref.ref] = []
        self.sample = sample

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in (out if isinstance(out, (list, tuple)) else [out]):
            if isinstance(value, torch.Tensor):
                self.refs.append(weakref.ref(value))
        self.sample()
        return out


def _storage_bytes(tensors: Iterable[torch.Tensor]) -> dict[int, int]:
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors
            if t.device.type != "meta" and t.untyped_storage().nbytes()}


def _live_bytes(model: nn.Module, optimizer: torch.optim.Optimizer, batch: list[torch.Tensor],
                saved: weakref.WeakValueDictionary, tracker: _Tracker) -> dict[str, int]:
    """The bytes of the storages alive now, by kind: each storage once, under the first kind of KINDS it is in."""
    params = list(model.parameters())
    known = {
        "parameters": _storage_bytes(params),
        "optimizer states": _storage_bytes(t for s in optimizer.state.values() for t in s.values()
                                           if isinstance(t, torch.Tensor)),
        "gradients": _storage_bytes(p.grad for p in params if p.grad is not None),
        "batch": _storage_bytes(batch),
        "saved for backward": _storage_bytes(saved.values()),
    }
    alive = [t for t in (ref() for ref in tracker.refs) if t is not None]
    if len(alive) * 2 < len(tracker.refs):  # drop dead references now and then: sampling stays cheap
        tracker.refs = [weakref.ref(t) for t in alive]
    known["other temporaries"] = _storage_bytes(alive)
    seen: set[int] = set()
    row = {}
    for kind in KINDS:
        fresh = {ptr: nbytes for ptr, nbytes in known[kind].items() if ptr not in seen}
        seen.update(fresh)
        row[kind] = sum(fresh.values())
    return row


def memory_timeline(model: nn.Module, optimizer: torch.optim.Optimizer, batches: Iterable,
                    loss_fn: Callable = nn.functional.cross_entropy) -> MemoryTimeline:
    """Train one step per (x, y) in `batches`, sampling the live tensors by kind after every operator (notebook 01).

    A step is forward, loss, backward, optimizer.step(), optimizer.zero_grad(set_to_none=True); the marks are
    "forward k", "backward k" and "optimizer.step() k" (each sampled just before that phase) and "end". Kinds:
    parameters, gradients and optimizer states (found where they live), the batch, tensors autograd saved for
    backward (seen by saved_tensors_hooks), and every other tensor still alive (outputs, temporaries).
    Each distinct storage counts once, under the first kind it belongs to in KINDS.
    """
    timeline = MemoryTimeline()
    saved: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
    current_batch: list[torch.Tensor] = []
    tracker: _Tracker

    def sample() -> None:
        timeline.samples.append(_live_bytes(model, optimizer, current_batch, saved, tracker))

    def mark(label: str) -> None:
        sample()
        timeline.marks.append((len(timeline.samples) - 1, label))

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t
        return t

    tracker = _Tracker(sample)
    for step, (x, y) in enumerate(batches, 1):
        current_batch[:] = [x, y]
        mark(f"forward {step}")
        with tracker, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = loss_fn(model(x), y)
        mark(f"backward {step}")
        with tracker:
            loss.backward()
        del loss
        saved.clear()  # backward has freed the graph; what it saved and is still alive (the batch) is not saved now
        mark(f"optimizer.step() {step}")
        with tracker:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # the gradients are gone at the next mark
        current_batch.clear()
    mark("end")
    return timeline
