"""What goes wrong in low precision: gradients that underflow to 0, updates that vanish, sums that stall (notebook 06).

    underflow_fraction(grads, dtype)   the share of nonzero values a cast to dtype turns into 0
    lost_update(w, u, dtype)           w + u in dtype: an update below half an ulp of w vanishes
    low_precision_sum(v, n, dtype)     v added n times in dtype: the running sum stalls

gradient_histogram (course_lib.precision.plots) draws the gradients that underflow_fraction counts.
"""

from __future__ import annotations

from typing import Iterable

import torch

from course_lib.precision._checks import _count, _real
from course_lib.precision.formats import _dtype

__all__ = ["underflow_fraction", "lost_update", "low_precision_sum"]


def _nonzero_values(grads) -> torch.Tensor:
    """All nonzero values of grads (tensors, or None for a parameter without a gradient) as one float64 vector."""
    if isinstance(grads, torch.Tensor):
        grads = [grads]
    try:
        tensors = list(grads)
    except TypeError:
        raise TypeError(f"grads must be an iterable of tensors, e.g. [p.grad for p in model.parameters()], "
                        f"not {type(grads).__name__}") from None
    pieces = []
    for g in tensors:
        if g is None:
            continue
        if not isinstance(g, torch.Tensor) or not g.is_floating_point():
            raise TypeError(f"grads must hold floating-point tensors (or None), not {type(g).__name__}"
                            + (f" of {g.dtype}" if isinstance(g, torch.Tensor) else ""))
        flat = g.detach().reshape(-1).to("cpu", torch.float64)
        pieces.append(flat[flat != 0])
    values = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.float64)
    if values.numel() == 0:
        raise ValueError("grads hold no nonzero value: call backward() first, and pass [p.grad for p in ...]")
    return values


def underflow_fraction(grads: Iterable[torch.Tensor], dtype) -> float:
    """The fraction of the nonzero values in grads that a cast to dtype turns into 0 (notebook 06).

    dtype: a torch dtype (torch.float16) or a format name ("fp16"). In fp16 a value below 2^−25 in magnitude
    rounds to 0 (between 2^−25 and 2^−24 it rounds to the smallest subnormal, 2^−24).
    """
    dtype = _dtype(dtype)
    values = _nonzero_values(grads)
    return (values.to(dtype) == 0).sum().item() / values.numel()


def _in_dtype(dtype: torch.dtype, *values: float) -> list[torch.Tensor]:
    return [torch.tensor(float(v), dtype=dtype) for v in values]


def lost_update(weight: float, update: float, dtype) -> float:
    """weight + update computed in dtype, as a float: lost_update(256, 1, torch.bfloat16) is 256.0 (notebook 06).

    Both are first rounded to dtype. torch's own addition where it has one (fp32, fp16, bf16); fp8 has none on the
    CPU, so the two fp8 values are added exactly in float64 and the sum rounded once, as IEEE addition does.
    """
    dtype = _dtype(dtype)
    for name, v in (("weight", weight), ("update", update)):
        if not _real(v):
            raise TypeError(f"{name} must be a real number, not {type(v).__name__}")
    w, u = _in_dtype(dtype, weight, update)
    try:
        return (w + u).item()
    except (RuntimeError, NotImplementedError):  # fp8: "add_stub" not implemented
        total = w.to(torch.float64) + u.to(torch.float64)
        return total.to(dtype).to(torch.float64).item()


def low_precision_sum(value: float, count: int, dtype) -> float:
    """value added count times, one at a time, into a running sum held in dtype (notebook 06).

    low_precision_sum(0.01, 1000, torch.bfloat16) is 4.0 and in torch.float16 9.953125 (fp32: 10.0001335): once the
    sum is large, half its ulp exceeds the value and each addition rounds back down.
    """
    dtype = _dtype(dtype)
    if not _real(value):
        raise TypeError(f"value must be a real number, not {type(value).__name__}")
    count = _count(count, "count")
    if count < 0:
        raise ValueError(f"count must be >= 0, not {count}")
    total, step = _in_dtype(dtype, 0.0, value)
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # no fp8 addition on the CPU: add exactly, round once
        total64, step64 = total.to(torch.float64), step.to(torch.float64)
        for _ in range(count):
            total64 = (total64 + step64).to(dtype).to(torch.float64)
        return total64.item()
    for _ in range(count):
        total = total + step
    return total.item()
