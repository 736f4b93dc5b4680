"""The lesson's figures: bit layouts, gradients against fp16's limits, GradScaler's runs (notebook 06).

    format_picture()                   each format's bit layout as boxes, widths proportional to bits
    gradient_histogram(grads)          log2|g| of gradients against fp16's and bf16's limits
    plot_scale_history(trace)          GradScaler's scale per step, skipped steps marked, the loss under it
    plot_losses(traces)                the loss curves of several train_with_scaler runs

Each returns a Figure (course_lib.diagrams.Picture: nothing in pyplot's state); matplotlib loads on the first call.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

from course_lib.precision.explorer import EXPONENT_COLOUR, MANTISSA_COLOUR, SIGN_COLOUR
from course_lib.precision.formats import FORMATS
from course_lib.precision.pitfalls import _nonzero_values
from course_lib.precision.scaling import ScalerTrace
from course_lib.tables import plural

__all__ = ["format_picture", "gradient_histogram", "plot_scale_history", "plot_losses"]


def _picture(**kw):
    from course_lib.diagrams import Picture

    return Picture(**kw)


def format_picture():
    """Each format's bit layout as boxes: sign, exponent, mantissa, widths proportional to bits (notebook 06).

    Beside each row: its max and eps. Returns a matplotlib Figure (nothing in pyplot's state).
    """
    from matplotlib.patches import Rectangle

    formats = list(FORMATS.values())
    fig = _picture(figsize=(11, 0.55 * len(formats) + 1.2), layout="constrained")
    ax = fig.subplots()
    for row, f in enumerate(formats):
        y = len(formats) - 1 - row
        start = 0
        for label, width, colour in (("sign", 1, SIGN_COLOUR), ("exponent", f.exponent_bits, EXPONENT_COLOUR),
                                     ("mantissa", f.mantissa_bits, MANTISSA_COLOUR)):
            ax.add_patch(Rectangle((start, y), width, 0.7, facecolor=colour, edgecolor="black", linewidth=1))
            for bit in range(1, width):  # a faint line between bits
                ax.plot([start + bit] * 2, [y, y + 0.7], color="white", linewidth=0.8)
            text = f"{label} {width}" if width >= 7 else str(width)
            ax.text(start + width / 2, y + 0.35, text, ha="center", va="center", fontsize=8.5)
            start += width
        ax.text(33, y + 0.35, f"max {f.max:.3g} · eps {f.eps:.3g}" + ("" if f.has_inf else " · no inf"),
                va="center", fontsize=8.5)
    ax.set_yticks([len(formats) - 1 - i + 0.35 for i in range(len(formats))],
                  [f"{f.name} ({f.bits})" for f in formats])
    ax.set_xticks(range(0, 33, 4))
    ax.set_xlim(-0.5, 46)
    ax.set_ylim(-0.3, len(formats))
    ax.set_xlabel("bits, from the sign bit")
    ax.set_ylabel("format (total bits)")
    ax.set_title("Bit layouts: sign · exponent (range) · mantissa (precision)")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig


def gradient_histogram(grads: Iterable[torch.Tensor], ax=None):
    """A histogram of log2|g| over all nonzero gradient values, against fp16's and bf16's limits (notebook 06).

    Vertical lines: fp16's smallest subnormal (2^−24), smallest normal (2^−14) and max (65504), and bf16's smallest
    normal (2^−126). The title says what share of the values fp16 would turn into 0. Draws on ax if given; returns
    the Figure.
    """
    import numpy as np

    values = _nonzero_values(grads)
    logs = torch.log2(values.abs()).numpy()
    fp16, bf16 = FORMATS["fp16"], FORMATS["bf16"]
    lines = [(math.log2(fp16.smallest_subnormal), "fp16 smallest subnormal 2^-24", "tab:red", "--"),
             (math.log2(fp16.smallest_normal), "fp16 smallest normal 2^-14", "tab:orange", "--"),
             (math.log2(fp16.max), "fp16 max 65504", "tab:purple", "--"),
             (math.log2(bf16.smallest_normal), "bf16 smallest normal 2^-126", "tab:green", ":")]
    if ax is None:
        fig = _picture(figsize=(9, 3.8), layout="constrained")
        ax = fig.subplots()
    low = math.floor(min(float(logs.min()), -127.0)) - 1
    high = math.ceil(max(float(logs.max()), 16.0)) + 1
    ax.hist(logs, bins=np.arange(math.floor(float(logs.min())), math.ceil(float(logs.max())) + 1.5, 1.0),
            color="#0072B2", alpha=0.8, label=f"gradients ({plural(values.numel(), 'nonzero value', spec=',')})")
    for x, label, colour, style in lines:
        ax.axvline(x, color=colour, linestyle=style, linewidth=1.5, label=label)
    ax.set_xlim(low, high)
    ax.set_xlabel("log2 |gradient value|")
    ax.set_ylabel("count of values (bins of one power of 2)")
    lost = (values.to(torch.float16) == 0).sum().item() / values.numel()
    ax.set_title(f"{lost:.1%} of the nonzero values would be 0 in fp16; bf16 keeps everything above 2^-133")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    return ax.figure


def _check_trace(trace) -> ScalerTrace:
    if not isinstance(trace, ScalerTrace):
        raise TypeError(f"trace must be a ScalerTrace from train_with_scaler, not {type(trace).__name__}")
    if not trace.loss:
        raise ValueError("trace has no steps: run train_with_scaler(steps) with steps >= 1")
    return trace


def plot_scale_history(trace: ScalerTrace):
    """GradScaler's scale per step (log axis) with skipped steps marked, and the loss under it (notebook 06)."""
    trace = _check_trace(trace)
    steps = range(len(trace.loss))
    fig = _picture(figsize=(9, 5.2), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    top.step(steps, trace.scale, where="post", color="#0072B2", label="scale used at the step")
    skips = [i for i, s in enumerate(trace.skipped) if s]
    if skips:
        top.plot(skips, [trace.scale[i] for i in skips], "x", color="tab:red", markersize=7,
                 label=f"skipped (inf/NaN in gradients): {plural(len(skips), 'step')}")
    top.set_yscale("log", base=2)
    top.set_ylabel("loss scale")
    top.set_title(f"{trace.label}: " + ("the scale doubles after each run of clean steps, halves on overflow"
                                        if trace.use_scaler else "no GradScaler, scale fixed at 1"))
    top.legend(fontsize=8, loc="lower right")
    top.grid(alpha=0.3)
    bottom.plot(steps, trace.loss, color="#D55E00")
    bottom.set_yscale("log")
    bottom.set_xlabel("step")
    bottom.set_ylabel("loss (MSE)")
    bottom.grid(alpha=0.3)
    return fig


def plot_losses(traces):
    """The loss curves of several train_with_scaler runs on one log axis, labelled by run (notebook 06)."""
    traces = [_check_trace(t) for t in traces]
    if not traces:
        raise ValueError("give at least one ScalerTrace")
    fig = _picture(figsize=(8, 4), layout="constrained")
    ax = fig.subplots()
    for trace, style in zip(traces, ["-", "--", "-.", ":"] * len(traces)):
        ax.plot(range(len(trace.loss)), trace.loss, linestyle=style, linewidth=2, label=trace.label)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (MSE)")
    ax.set_title("The same network and data in each precision")
    ax.legend(fontsize=9)
    ax.grid(alpha=0.3)
    return fig
