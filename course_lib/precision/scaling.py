"""Scaling values into a narrow format's range: GradScaler's loss scaling, and fp8's scale per tensor (notebook 06).

    train_with_scaler(steps, ...)      a tiny MLP whose gradients underflow in fp16: fp32, bf16, fp16 with or without
                                       GradScaler; a ScalerTrace per run (plots.plot_scale_history, plots.plot_losses)
    scaler_demo_gradients()            that MLP's fp32 gradients at its first step, for gradient_histogram
    fp8_cast, fp8_scaling_run          fp8 with a per-tensor scale, saturating; current against delayed scaling
                                       (amax history) over a run of tensors, fp8_demo_tensors one whose amax jumps
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Iterable

import torch

from course_lib.precision._checks import _count, _finite, _seed
from course_lib.precision.formats import Format, _dtype, _format

__all__ = ["LOSS_WEIGHT", "ScalerTrace", "train_with_scaler", "scaler_demo_gradients", "fp8_cast", "Fp8ScalingStep",
           "FP8_RECIPES", "fp8_scaling_run", "fp8_demo_tensors"]

# ---------------------------------------------------------------------------------------------------- loss scaling

# The demo problem: 256 rows of 16 inputs, 8 targets from a fixed random teacher; a 16-64-8 MLP trained with Adam.
_ROWS, _INPUTS, _HIDDEN, _OUTPUTS = 256, 16, 64, 8
# The loss is weighted by LOSS_WEIGHT so that this small network's gradients are as small as the smallest ones of a
# large network (Micikevicius et al. 2018, "Mixed Precision Training", arXiv:1710.03740, Figure 3: a histogram of the
# activation gradient values met while training a Multibox SSD, with a separate bin for zeros: 67% of the values are
# zero, 2% lie in [2^-34, 2^-32), below fp16's smallest subnormal 2^-24, and 2% in [2^-24, 2^-23); fp16's range above
# the gradients goes unused, which is what loss scaling exploits): the gradient of each output is about
# 1e-5 · 2|error| / 2048 ≈ 7e-9, under 2^-25 ≈ 3e-8, so fp16 rounds every one to 0. Adam divides by the gradients'
# own scale, so with eps = 1e-12 (its default 1e-8 would swamp gradients this small) fp32 learns exactly as it would
# unweighted.
LOSS_WEIGHT = 1e-5
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass
class ScalerTrace:
    """One run of train_with_scaler: a value per step (notebook 06).

    loss: the unweighted mean squared error, in fp32. scale: GradScaler's scale used at that step (1.0 without a
    scaler). skipped: the scaler skipped the optimizer step (an inf or NaN in the scaled gradients), read as the
    scale dropping at update(). updated: the parameters changed at that step. zero_grads: the fraction of gradient
    entries exactly 0 after backward.
    """

    dtype: str
    use_scaler: bool
    loss: list[float] = field(default_factory=list)
    scale: list[float] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)
    updated: list[bool] = field(default_factory=list)
    zero_grads: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        """E.g. "fp16 autocast + GradScaler", "fp32"."""
        if self.use_scaler:
            return ("fp32" if self.dtype == "fp32" else f"{self.dtype} autocast") + " + GradScaler"
        return {"fp32": "fp32", "fp16": "fp16 autocast, no scaler"}.get(self.dtype, f"{self.dtype} autocast")


def _demo_problem(seed: int):
    """(model, inputs, targets) of the demo, the same for every dtype with the same seed."""
    from torch import nn

    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(_ROWS, _INPUTS, generator=generator)
    teacher_in = torch.randn(_INPUTS, _HIDDEN, generator=generator) / 4
    teacher_out = torch.randn(_HIDDEN, _OUTPUTS, generator=generator) / 8
    y = torch.tanh(x @ teacher_in) @ teacher_out
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(_INPUTS, _HIDDEN), nn.ReLU(), nn.Linear(_HIDDEN, _OUTPUTS))
    return model, x, y


def scaler_demo_gradients(seed: int = 0, *, loss_weight: float = LOSS_WEIGHT) -> list[torch.Tensor]:
    """fp32 gradients of train_with_scaler's network at its first step, weighted loss included (notebook 06).

    To draw with gradient_histogram: the weights' gradients, and the gradient of the network's output (the tensor
    that fp16 autocast would hold in fp16 first), as plain fp32 tensors.
    """
    import torch.nn.functional as F

    seed = _seed(seed)
    model, x, y = _demo_problem(seed)
    out = model(x)
    out.retain_grad()
    (loss_weight * F.mse_loss(out, y)).backward()
    return [out.grad.detach()] + [p.grad.detach() for p in model.parameters()]


def _scaler_arguments(steps, dtype, use_scaler, seed, init_scale, growth_interval, loss_weight) -> tuple:
    """train_with_scaler's arguments checked, in its order: (steps, dtype, use_scaler, seed, growth_interval)."""
    if isinstance(dtype, str):
        dtype = _dtype(dtype)
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"dtype must be torch.float32, torch.bfloat16 or torch.float16, not {dtype!r}")
    steps = _count(steps, "steps")
    if steps < 1:
        raise ValueError(f"steps must be 1 or more, not {steps}")
    seed = _seed(seed)
    if use_scaler is None:
        use_scaler = dtype == torch.float16
    if not isinstance(use_scaler, bool):
        raise TypeError(f"use_scaler must be True, False or None, not {use_scaler!r}")
    if not (_finite(init_scale) and init_scale > 0):
        raise ValueError(f"init_scale must be a finite number > 0, not {init_scale!r}")
    growth_interval = _count(growth_interval, "growth_interval")
    if growth_interval < 1:
        raise ValueError(f"growth_interval must be 1 or more, not {growth_interval}")
    if not (_finite(loss_weight) and loss_weight > 0):
        raise ValueError(f"loss_weight must be a finite number > 0, not {loss_weight!r}")
    return steps, dtype, use_scaler, seed, growth_interval


def train_with_scaler(steps: int, *, dtype: torch.dtype = torch.float16, use_scaler: bool | None = None, seed: int = 0,
                      init_scale: float = 2.0**16, growth_interval: int = 5,
                      loss_weight: float = LOSS_WEIGHT) -> ScalerTrace:
    """Train the demo MLP for `steps` steps on the CPU under autocast(dtype), with or without GradScaler (notebook 06).

    dtype: torch.float32 (no autocast), torch.bfloat16 or torch.float16 (torch.autocast("cpu", dtype)).
    use_scaler: torch.amp.GradScaler("cpu", init_scale, growth_interval) around backward and step; None (the default)
    means True for fp16 and False otherwise. Each step: zero_grad, forward under autocast, the loss in fp32
    (loss_weight · MSE), backward of the scaled loss, scaler.step, scaler.update.

    With the default loss weight every gradient is around 1e-8, below fp16's smallest subnormal: fp16 without a
    scaler gets all-zero gradients and its loss does not move; with the scaler (2^16 · 1e-8 ≈ 6e-4) it learns like
    fp32 and bf16. growth_interval is 5 here, not torch's 2000, so a short run shows the scale doubling every 5
    clean steps until the scaled gradients overflow fp16 (near 2^43, around step 135): from then on each overflow
    skips a step and halves the scale, a saw-tooth.
    """
    import torch.nn.functional as F

    steps, dtype, use_scaler, seed, growth_interval = _scaler_arguments(steps, dtype, use_scaler, seed, init_scale,
                                                                        growth_interval, loss_weight)

    model, x, y = _demo_problem(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-12)
    scaler = torch.amp.GradScaler("cpu", init_scale=float(init_scale), growth_interval=growth_interval,
                                  enabled=use_scaler)
    trace = ScalerTrace(_DTYPE_NAMES[dtype], use_scaler)
    params = list(model.parameters())
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        autocast = (torch.autocast("cpu", dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext())
        with autocast:
            out = model(x)
        loss = F.mse_loss(out.float(), y)
        before = scaler.get_scale() if use_scaler else 1.0
        scaler.scale(loss_weight * loss).backward()
        zeros = sum(int((p.grad == 0).sum()) for p in params)
        old = torch.cat([p.detach().reshape(-1) for p in params]).clone()
        scaler.step(optimizer)
        scaler.update()
        after = scaler.get_scale() if use_scaler else 1.0
        trace.loss.append(loss.item())
        trace.scale.append(float(before))
        trace.skipped.append(after < before)
        trace.updated.append(not torch.equal(old, torch.cat([p.detach().reshape(-1) for p in params])))
        trace.zero_grads.append(zeros / sum(p.numel() for p in params))
    return trace


# ---------------------------------------------------------------------------------------------------- fp8 scaling

_FP8 = ("fp8 e4m3", "fp8 e5m2")


def _fp8_format(fmt) -> Format:
    f = _format(fmt)
    if f.name not in _FP8:
        raise ValueError(f"fmt must be an fp8 format, {' or '.join(map(repr, _FP8))}, not {f.name!r}")
    return f


def _positive_scale(scale) -> float:
    if isinstance(scale, torch.Tensor) and scale.numel() == 1:
        scale = scale.item()
    if not (_finite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0 (e.g. 448 / amax), not {scale!r}")
    return float(scale)


def fp8_cast(t: torch.Tensor, scale: float, fmt: str = "fp8 e4m3") -> tuple[torch.Tensor, float]:
    """t multiplied by scale, saturated to the format's ±max, rounded to fp8, divided by scale (notebook 06).

    Returns (the values the fp8 tensor stands for, as float32; the fraction of t's values that saturated: whose
    scaled value t·scale, computed in float32, lies more than half an ulp above max, where rounding alone would not
    bring it back to max). The clamp before the cast is what fp8 recipes do (torchao's to_fp8_saturated), and it
    makes the result the same on every torch: torch 2.11 casts values beyond e4m3's range to NaN, 2.14 saturates
    (pytorch/pytorch#178817).
    """
    f = _fp8_format(fmt)
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise TypeError(f"t must be a floating-point tensor, not {type(t).__name__}")
    scale = _positive_scale(scale)
    scaled = t.detach().to(torch.float32) * scale
    half_ulp = 2.0 ** (math.frexp(f.max)[1] - 2 - f.mantissa_bits)  # 16 for e4m3 (448 + 16 rounds to 448), 4096 e5m2
    saturated = (scaled.abs() > f.max + half_ulp).float().mean().item() if scaled.numel() else 0.0
    stored = scaled.clamp(-f.max, f.max).to(f.dtype)
    return stored.to(torch.float32) / scale, saturated


@dataclass(frozen=True)
class Fp8ScalingStep:
    """One tensor cast to fp8 by fp8_scaling_run (notebook 06).

    amax: the tensor's own largest |value|. scale: the scale the recipe used. saturated: the fraction of values that
    only the clamp to ±max kept in range (fp8_cast). flushed: the fraction of nonzero values that became 0.
    error: ‖fp8 values − t‖ / ‖t‖.
    """

    step: int
    amax: float
    scale: float
    saturated: float
    flushed: float
    error: float


FP8_RECIPES = ("current", "delayed")


def fp8_scaling_run(tensors: Iterable[torch.Tensor], recipe: str = "current", *, history_len: int = 16,
                    fmt: str = "fp8 e4m3", margin: int = 0) -> list[Fp8ScalingStep]:
    """Cast tensors (one per training step) to fp8 with one scale per tensor; a row per tensor (notebook 06).

    recipe "current": scale = max / amax of the tensor itself, found by reading it before the cast (torchao's default
    tensorwise scaling; Transformer Engine's Float8CurrentScaling). recipe "delayed": scale = max / the largest amax
    of the previous history_len tensors, then the tensor's own amax joins the history (Transformer Engine's
    DelayedScaling, whose defaults are amax_history_len=1024 and amax_compute_algo="max"): no extra pass over the
    tensor, but a tensor larger than its history saturates. The first tensor, with no history yet, uses its own amax.
    Both divide the scale by 2^margin, as DelayedScaling's margin does. A tensor of zeros keeps the previous scale
    (1.0 at the start).
    """
    if recipe not in FP8_RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(map(repr, FP8_RECIPES))}, not {recipe!r}")
    f = _fp8_format(fmt)
    history_len = _count(history_len, "history_len")
    if history_len < 1:
        raise ValueError(f"history_len must be 1 or more, not {history_len}")
    margin = _count(margin, "margin")
    if margin < 0:
        raise ValueError(f"margin must be >= 0, not {margin}")
    try:
        tensors = list(tensors)
    except TypeError:
        raise TypeError(f"tensors must be an iterable of tensors, not {type(tensors).__name__}") from None
    history: list[float] = []
    scale, rows = 1.0, []
    for step, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or not bool(torch.isfinite(t).all()):
            raise ValueError(f"tensors[{step}] must be a floating-point tensor of finite values")
        t = t.detach().to(torch.float32)
        amax = t.abs().max().item() if t.numel() else 0.0
        reference = amax if recipe == "current" or not history else max(history)
        if reference > 0:
            scale = f.max / reference / 2.0**margin
        values, saturated = fp8_cast(t, scale, f.name)
        nonzero = t != 0
        flushed = ((values == 0) & nonzero).sum().item() / max(1, nonzero.sum().item())
        norm = t.norm().item()
        error = (values - t).norm().item() / norm if norm > 0 else 0.0
        rows.append(Fp8ScalingStep(step, amax, scale, saturated, flushed, error))
        history = (history + [amax])[-history_len:]
    return rows


def fp8_demo_tensors(steps: int = 12, *, spike_at: int = 6, spike: float = 8.0, size: int = 4096,
                     seed: int = 0) -> list[torch.Tensor]:
    """`steps` tensors of `size` normal values, one per step; the one at spike_at is `spike` times larger (notebook 06).

    The activations of a step whose amax jumps (a loss spike, an outlier batch): what separates delayed scaling, whose
    scale comes from the amaxes of earlier steps, from current scaling.
    """
    steps, size, seed = _count(steps, "steps"), _count(size, "size"), _seed(seed)
    if steps < 1 or size < 1:
        raise ValueError(f"steps and size must be 1 or more, not {steps} and {size}")
    spike_at = _count(spike_at, "spike_at")
    if not (_finite(spike) and spike > 0):
        raise ValueError(f"spike must be a finite number > 0, not {spike!r}")
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(size, generator=generator) * (spike if i == spike_at else 1.0) for i in range(steps)]
