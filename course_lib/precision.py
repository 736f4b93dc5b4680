"""Number formats, rounding, loss scaling and what lower precision buys on a GPU (notebook 06).

    Format, FORMATS                    fp32, tf32, fp16, bf16, fp8 e4m3, fp8 e5m2: bits, torch dtype, what each is for
    limits_table(), print_limits()     max, smallest normal, smallest subnormal, eps: from the bits and from torch
    round_to(x, fmt)                   a number or tensor rounded to a format (torch's casts; tf32 on the fp32 bits)
    bit_fields(value, fmt)             sign, exponent and mantissa bits of the rounded value
    bits_html(value), format_explorer  the bits of one number in every format, coloured; a text box that redraws them
    format_picture()                   each format's bit layout as boxes, widths proportional to bits
    gradient_histogram(grads)          log2|g| of gradients against fp16's and bf16's limits
    underflow_fraction(grads, dtype)   the share of nonzero values a cast to dtype turns into 0
    lost_update(w, u, dtype)           w + u in dtype: an update below half an ulp of w vanishes
    low_precision_sum(v, n, dtype)     v added n times in dtype: the running sum stalls
    train_with_scaler(steps, ...)      a tiny MLP whose gradients underflow in fp16: fp32, bf16, fp16 with or without
                                       GradScaler; a ScalerTrace per run, drawn by plot_scale_history / plot_losses
    fp8_cast, fp8_scaling_run          fp8 with a per-tensor scale, saturating; current against delayed scaling
                                       (amax history) over a run of tensors, fp8_demo_tensors one whose amax jumps
    GPU_PEAKS, roofline_time, ...      an H100 SXM's published peaks: a matmul's predicted time per format, and
                                       Amdahl's law for the whole step

Everything runs on the CPU; the GPU figures are published peaks, not measurements (benchmarks/amp_step.py measures).
"""

from __future__ import annotations

import contextlib
import html
import math
import numbers
import operator
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Mapping

import torch

from course_lib.tables import plural, print_table

__all__ = ["Format", "FORMATS", "limits_table", "print_limits", "round_to", "bit_fields", "bits_html",
           "format_explorer", "format_picture", "gradient_histogram", "underflow_fraction", "lost_update",
           "low_precision_sum", "ScalerTrace", "train_with_scaler", "scaler_demo_gradients", "plot_scale_history",
           "plot_losses", "fp8_cast", "Fp8ScalingStep", "FP8_RECIPES", "fp8_scaling_run", "fp8_demo_tensors",
           "GPUPeaks", "GPU_PEAKS", "roofline_time", "MatmulPrediction", "matmul_prediction", "amdahl_speedup"]

# Colours of the three fields, light enough for black text (Okabe–Ito hues, as course_lib.diagrams uses).
SIGN_COLOUR = "#F4B6D2"  # reddish purple, lightened
EXPONENT_COLOUR = "#A9D8F5"  # sky blue, lightened
MANTISSA_COLOUR = "#F7D48A"  # orange, lightened


def _real(x) -> bool:
    """A real number (numpy's too), not a bool; may be inf or NaN."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _finite(x) -> bool:
    return _real(x) and math.isfinite(x)


# ---------------------------------------------------------------------------------------------------- formats


@dataclass(frozen=True)
class Format:
    """A binary floating-point format: 1 sign bit, exponent bits, mantissa bits, and its torch dtype (notebook 06).

    dtype is None for tf32, which is not a storage type: tensor cores read fp32 inputs with their mantissa cut to 10
    bits. has_inf: False for fp8 e4m3 (torch.float8_e4m3fn, "fn": finite and NaN only), whose top exponent holds
    ordinary numbers up to 448 and only S.1111.111 is NaN. The properties compute the limits from the bits.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    dtype: torch.dtype | None
    has_inf: bool
    use: str

    @property
    def bits(self) -> int:
        """1 + exponent_bits + mantissa_bits (19 for tf32, which is stored in 32)."""
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        """The exponent bias, 2^(e−1) − 1: a stored exponent field E means 2^(E − bias)."""
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def max(self) -> float:
        """The largest finite value, from the bits.

        With inf (IEEE style) the top exponent field is reserved, so the largest is (2 − 2^−m) · 2^(2^e − 2 − bias).
        Without inf (e4m3fn) the top field holds numbers too, except the all-ones mantissa (NaN):
        (2 − 2^(1−m)) · 2^(2^e − 1 − bias) = 1.75 · 2^8 = 448.
        """
        m, top = self.mantissa_bits, 2**self.exponent_bits - 1
        if self.has_inf:
            return (2.0 - 2.0**-m) * 2.0 ** (top - 1 - self.bias)
        return (2.0 - 2.0 ** (1 - m)) * 2.0 ** (top - self.bias)

    @property
    def smallest_normal(self) -> float:
        """2^(1 − bias): exponent field 1, mantissa 0."""
        return 2.0 ** (1 - self.bias)

    @property
    def smallest_subnormal(self) -> float:
        """2^(1 − bias − m): exponent field 0, mantissa ...001 (the bit pattern 1)."""
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """2^−m: the gap between 1 and the next number (torch.finfo's eps)."""
        return 2.0**-self.mantissa_bits

    @property
    def storage_bytes(self) -> int:
        """Bytes per element in memory: the dtype's itemsize, 4 for tf32 (held as fp32)."""
        return self.dtype.itemsize if self.dtype is not None else 4


FORMATS: dict[str, Format] = {f.name: f for f in [
    Format("fp32", 8, 23, torch.float32, True, "master weights, optimizer state, reductions"),
    Format("tf32", 8, 10, None, True, "tensor-core input for fp32 matmuls (Ampere and later), stored as fp32"),
    Format("fp16", 5, 10, torch.float16, True, "activations and matmuls; needs loss scaling"),
    Format("bf16", 8, 7, torch.bfloat16, True, "activations and matmuls; fp32's range, no loss scaling"),
    Format("fp8 e4m3", 4, 3, torch.float8_e4m3fn, False, "matmul inputs in the forward, with a scale per tensor"),
    Format("fp8 e5m2", 5, 2, torch.float8_e5m2, True, "gradients in the backward: range before precision"),
]}


def _format(fmt) -> Format:
    """The Format named fmt (a key of FORMATS), or fmt itself if it is a Format."""
    if isinstance(fmt, Format):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a format name, one of {', '.join(map(repr, FORMATS))}, "
                        f"not {type(fmt).__name__}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(map(repr, FORMATS))}")
    return FORMATS[fmt]


def _torch_limits(f: Format) -> tuple[dict[str, float], str]:
    """max, smallest normal, smallest subnormal and eps as torch gives them, and where they come from."""
    if f.dtype is not None:
        info = torch.finfo(f.dtype)
        one = torch.tensor([1], dtype=_INT_VIEW[f.bits]).view(f.dtype)  # bit pattern 0...01: the smallest subnormal
        return ({"max": float(info.max), "smallest normal": float(info.smallest_normal),
                 "smallest subnormal": one.to(torch.float64).item(), "eps": float(info.eps)},
                f"torch.finfo({f.dtype}); subnormal: bit pattern 1 viewed as {f.dtype}")
    # tf32 has no dtype: read its limits off fp32 bit patterns whose 13 low mantissa bits are 0.
    low = 23 - f.mantissa_bits
    patterns = {"max": (0x7F7FFFFF >> low) << low, "smallest normal": 0x00800000, "smallest subnormal": 1 << low,
                "one plus eps": 0x3F800000 | (1 << low)}
    values = dict(zip(patterns, torch.tensor(list(patterns.values()), dtype=torch.int32).view(torch.float32)
                      .to(torch.float64).tolist()))
    values["eps"] = values.pop("one plus eps") - 1.0
    return values, "float32 bit patterns with the 13 low mantissa bits 0"


_INT_VIEW = {8: torch.uint8, 16: torch.int16, 32: torch.int32}
_LIMITS = ("max", "smallest normal", "smallest subnormal", "eps")


def limits_table() -> list[dict]:
    """One row per format: each limit from the bits and from torch, and whether they agree (notebook 06).

    Keys: format, exponent bits, mantissa bits, dtype; max, smallest normal, smallest subnormal, eps (from the bits,
    Format's formulas); torch max, torch smallest normal, torch smallest subnormal, torch eps (torch.finfo, the
    subnormal from the bit pattern 1 viewed as the dtype; for tf32 fp32 bit patterns); torch source; agree (True
    when all four pairs are equal, exactly: every one is a power of two or a short binary fraction).
    """
    rows = []
    for f in FORMATS.values():
        from_torch, source = _torch_limits(f)
        row = {"format": f.name, "exponent bits": f.exponent_bits, "mantissa bits": f.mantissa_bits,
               "dtype": str(f.dtype) if f.dtype is not None else "none (stored as torch.float32)",
               "max": f.max, "smallest normal": f.smallest_normal, "smallest subnormal": f.smallest_subnormal,
               "eps": f.eps}
        row |= {f"torch {k}": from_torch[k] for k in _LIMITS}
        row["torch source"] = source
        row["agree"] = all(row[k] == row[f"torch {k}"] for k in _LIMITS)
        rows.append(row)
    return rows


def print_limits() -> None:
    """Print limits_table() as a table: the limits from the bits, and whether torch agrees (notebook 06)."""
    rows = [[r["format"], f"1+{r['exponent bits']}+{r['mantissa bits']}", f"{r['max']:.4g}",
             f"{r['smallest normal']:.3g}", f"{r['smallest subnormal']:.3g}", f"{r['eps']:.3g}",
             "yes" if r["agree"] else "NO"] for r in limits_table()]
    print_table(["format", "bits s+e+m", "max", "smallest normal", "smallest subnormal", "eps", "torch agrees"], rows)
    print("torch's side: torch.finfo and the bit pattern 1 viewed as the dtype; tf32 (no dtype): fp32 bit patterns.")


# ---------------------------------------------------------------------------------------------------- rounding


def _round_tensor(t: torch.Tensor, f: Format) -> torch.Tensor:
    """t (float64) rounded to f, as float64."""
    if f.dtype is not None:
        return t.to(f.dtype).to(torch.float64)
    # tf32: round the fp32 value's mantissa to 10 bits, to nearest, ties to even, on its bits (int64: no overflow).
    low = 23 - f.mantissa_bits
    bits = t.to(torch.float32).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    finite = (bits & 0x7F800000) != 0x7F800000
    half_minus_one = (1 << (low - 1)) - 1
    rounded = (bits + half_minus_one + ((bits >> low) & 1)) & ~((1 << low) - 1)  # may carry up to inf: correct
    rounded = torch.where(finite, rounded, bits)
    rounded = torch.where(rounded >= 2**31, rounded - 2**32, rounded)  # back to int32's signed range
    return rounded.to(torch.int32).view(torch.float32).to(torch.float64)


def round_to(x, fmt: str):
    """x rounded to the format: a float for a number, a float64 tensor for a tensor (notebook 06).

    Through torch's casts (x → float64 → the dtype → float64), so the result is what torch stores: round to nearest,
    ties to even; overflow gives inf, except fp8 e4m3, which has no inf (torch 2.14 saturates at ±448, see
    bits_html). torch casts a float64 to a narrower dtype through float32, so a float64 that lies within float32's
    rounding of a halfway point rounds twice (1 + 2^-11 + 2^-40 gives 1.0 in fp16, not 1 + 2^-10); a number you
    type with a few digits never does. tf32 has no dtype: the fp32 value's mantissa is rounded to 10 bits, to nearest,
    ties to even, on its int32 bits (GPU libraries round fp32 to tf32 to nearest or cut the bits; the two differ by
    at most one ulp).
    """
    f = _format(fmt)
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool or x.is_complex():
            raise TypeError(f"x must be a real-valued tensor, not one of {x.dtype}")
        return _round_tensor(x.detach().to(torch.float64), f)
    if not _real(x):
        raise TypeError(f"x must be a real number or a tensor, not {type(x).__name__}")
    return _round_tensor(torch.tensor(float(x), dtype=torch.float64), f).item()


def _pattern(value: float, f: Format) -> int:
    """The bit pattern (as an unsigned int of f.bits bits) of value rounded to f."""
    t = torch.tensor(float(value), dtype=torch.float64)
    if f.dtype is not None:
        return t.to(f.dtype).view(_INT_VIEW[f.bits]).item() & (2**f.bits - 1)
    fp32_bits = _round_tensor(t, f).to(torch.float32).view(torch.int32).item() & 0xFFFFFFFF
    return fp32_bits >> (23 - f.mantissa_bits)


def bit_fields(value: float, fmt: str) -> tuple[str, str, str]:
    """The sign, exponent and mantissa bits of value rounded to the format, as strings of 0 and 1 (notebook 06).

    bit_fields(1.0, "bf16") is ("0", "01111111", "0000000"). tf32 gives its 19 bits (the top 19 of the fp32 word).
    """
    f = _format(fmt)
    if not _real(value):
        raise TypeError(f"value must be a real number, not {type(value).__name__}")
    word = format(_pattern(value, f), f"0{f.bits}b")
    return word[0], word[1:1 + f.exponent_bits], word[1 + f.exponent_bits:]


def _note(value: float, rounded: float, f: Format) -> str:
    """What happened to value in f: overflow, NaN, underflow, subnormal, or nothing to say."""
    if math.isnan(value):
        return "NaN"
    if math.isnan(rounded):  # e4m3 has no inf: older torch versions cast overflow to NaN
        return "inf → NaN (no inf in this format)" if math.isinf(value) else "overflow → NaN"
    if math.isinf(rounded):
        return "inf" if math.isinf(value) else "overflow → inf"
    if math.isinf(value):
        return f"inf → {rounded:g}: saturated (no inf in this format)"
    if abs(value) > f.max:
        top = math.frexp(f.max)[1] - 1  # the exponent of the top binade
        if abs(value) > f.max + 2.0 ** (top - f.mantissa_bits - 1):  # beyond rounding distance of max
            return f"overflow → saturated to {rounded:g}"
    if value != 0 and rounded == 0:
        return "underflow → 0"
    if rounded != 0 and abs(rounded) < f.smallest_normal:
        return "subnormal"
    return ""


def _bit_spans(fields: tuple[str, str, str]) -> str:
    cells = []
    for bits, colour in zip(fields, (SIGN_COLOUR, EXPONENT_COLOUR, MANTISSA_COLOUR)):
        cells.append("".join(f'<span style="background:{colour};padding:0 1px;color:#000">{b}</span>' for b in bits))
    return '<span style="font-family:monospace;white-space:nowrap">' + "&thinsp;".join(cells) + "</span>"


def _relative_error(value: float, rounded: float) -> str:
    if not (math.isfinite(value) and math.isfinite(rounded)):
        return "—"
    if value == 0:
        return "0" if rounded == 0 else "—"
    error = abs(rounded - value) / abs(value)
    return "0 (exact)" if error == 0 else f"{error:.2e}"


def bits_html(value: float) -> str:
    """An HTML table of value in every format: coloured bits, the stored value, relative error, a note (notebook 06).

    Notes: "overflow → inf"; "underflow → 0"; "subnormal"; "NaN". fp8 e4m3 has no inf, and the note says what this
    torch's cast did: torch 2.14 saturates at ±448, for ±inf too (c10's fp8e4m3fn_from_fp32_value, changed in
    pytorch/pytorch#178817, April 2026); earlier versions gave NaN from 480 up.
    """
    if not _real(value):
        raise TypeError(f"value must be a real number, not {type(value).__name__}")
    value = float(value)
    th = 'style="text-align:left;padding:2px 10px 2px 0"'
    td = 'style="text-align:left;padding:2px 10px 2px 0"'
    rows = [f"<tr><th {th}>format</th><th {th}>bits (sign · exponent · mantissa)</th><th {th}>stored value</th>"
            f"<th {th}>relative error</th><th {th}>note</th></tr>"]
    for f in FORMATS.values():
        rounded = round_to(value, f)
        name = html.escape(f.name) + (" <small>(in fp32)</small>" if f.dtype is None else "")
        rows.append(f"<tr><td {td}>{name}</td><td {td}>{_bit_spans(bit_fields(value, f))}</td>"
                    f"<td {td}><code>{rounded!r}</code></td><td {td}>{_relative_error(value, rounded)}</td>"
                    f"<td {td}>{html.escape(_note(value, rounded, f))}</td></tr>")
    legend = " ".join(f'<span style="background:{c};padding:0 6px;color:#000">{n}</span>'
                      for n, c in (("sign", SIGN_COLOUR), ("exponent", EXPONENT_COLOUR), ("mantissa", MANTISSA_COLOUR)))
    return (f'<div><p style="margin:2px 0">{html.escape(repr(value))} in each format · {legend}</p>'
            f'<table style="border-collapse:collapse">{"".join(rows)}</table></div>')


_POWER = re.compile(r"^\s*([+-]?\d+(?:\.\d*)?)\s*(?:\*\*|\^)\s*([+-]?\d+)\s*$")


def _parse_number(text: str) -> float | None:
    """A float from '0.1', '1e-8', 'inf', '-nan', or a power like '2**-24' / '2^-24'; None if it is none of these."""
    try:
        return float(text)
    except ValueError:
        pass
    match = _POWER.match(text)
    if match:
        base, power = float(match.group(1)), int(match.group(2))
        try:
            return base**power
        except OverflowError:  # 2**5000: as float("1e5000"), inf
            return -math.inf if base < 0 and power % 2 else math.inf
        except ZeroDivisionError:  # 0**-1
            return None
    return None


def format_explorer(initial: str = "0.1"):
    """A text box for a number and, under it, its bits in every format (bits_html), redrawn as you type (notebook 06).

    Accepts 0.1, -3e5, 1e-8, inf, nan, and powers such as 2**-24 or 2^-24; anything else gets a message saying what
    to type. Returns the ipywidgets VBox (text box, HTML).
    """
    import ipywidgets as widgets

    if _real(initial):
        initial = repr(float(initial))
    if not isinstance(initial, str):
        raise TypeError(f"initial must be the text of a number, like '0.1', not {type(initial).__name__}")
    box = widgets.Text(value=initial, description="number", placeholder="0.1, 1e-8, 70000, 2**-24, inf",
                       continuous_update=True, layout=widgets.Layout(width="360px"))
    shown = widgets.HTML()

    def redraw(change=None):
        value = _parse_number(box.value)
        if value is None:
            shown.value = (f"<p><b>{html.escape(box.value.strip())!s}</b> is not a number: type a decimal (0.1), "
                           "scientific notation (1e-8), a power (2**-24), inf or nan.</p>")
        else:
            shown.value = bits_html(value)

    box.observe(redraw, names="value")
    redraw()
    return widgets.VBox([box, shown])


# ---------------------------------------------------------------------------------------------------- pictures


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


def _dtype(dtype, what: str = "dtype") -> torch.dtype:
    """A floating torch dtype, from a dtype or a format name that has one."""
    if isinstance(dtype, str):
        f = _format(dtype)
        if f.dtype is None:
            raise ValueError(f"{f.name} has no torch dtype (it is a matmul input format held as fp32): "
                             "pass a format that has one")
        return f.dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{what} must be a floating-point torch dtype such as torch.float16, or a format name, "
                        f"not {dtype!r}")
    return dtype


def underflow_fraction(grads: Iterable[torch.Tensor], dtype) -> float:
    """The fraction of the nonzero values in grads that a cast to dtype turns into 0 (notebook 06).

    dtype: a torch dtype (torch.float16) or a format name ("fp16"). In fp16 a value below 2^−25 in magnitude
    rounds to 0 (between 2^−25 and 2^−24 it rounds to the smallest subnormal, 2^−24).
    """
    dtype = _dtype(dtype)
    values = _nonzero_values(grads)
    return (values.to(dtype) == 0).sum().item() / values.numel()


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


# ---------------------------------------------------------------------------------------------------- arithmetic


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


def _count(n, what: str) -> int:
    """n as an int: the course's rule for counts, an int (numpy's too) or an integral float such as 1000.0 (used as
    int(1000.0)); a bool, a fractional float, nan, inf or anything else is a TypeError."""
    if isinstance(n, bool):
        raise TypeError(f"{what} must be a whole number (an int, or an integral float such as 1000.0), not {n!r}")
    if isinstance(n, float) and math.isfinite(n) and n.is_integer():
        return int(n)
    try:
        return operator.index(n)
    except TypeError:
        raise TypeError(f"{what} must be a whole number (an int, or an integral float such as 1000.0), "
                        f"not {n!r}") from None


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


def _seed(seed) -> int:
    seed = _count(seed, "seed")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, not {seed}")
    return seed


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


# ---------------------------------------------------------------------------------------------------- GPU model


@dataclass(frozen=True)
class GPUPeaks:
    """A GPU's published peaks: dense TFLOP/s per format and memory bandwidth, with sources (notebook 06).

    tflops maps format names (keys of FORMATS) to dense peak TFLOP/s (10^12 FLOP/s, no 2:4 sparsity);
    GPU_PEAKS["bf16"] reads one. bandwidth_TBps: memory bandwidth in TB/s (10^12 bytes per second).
    """

    name: str
    tflops: Mapping[str, float]
    bandwidth_TBps: float
    source: str

    def __post_init__(self):
        object.__setattr__(self, "tflops", MappingProxyType(dict(self.tflops)))  # read-only, as the rest
        for fmt, value in self.tflops.items():
            _format(fmt)
            if not (_finite(value) and value > 0):
                raise ValueError(f"{self.name}: peak for {fmt} must be a finite number of TFLOP/s > 0, not {value!r}")
        if not (_finite(self.bandwidth_TBps) and self.bandwidth_TBps > 0):
            raise ValueError(f"{self.name}: bandwidth_TBps must be a finite number > 0, not {self.bandwidth_TBps!r}")

    def __getitem__(self, fmt: str) -> float:
        name = _format(fmt).name
        if name not in self.tflops:
            raise ValueError(f"{self.name} has no published peak for {name}: it has {', '.join(self.tflops)}")
        return self.tflops[name]

    def flops_per_s(self, fmt: str) -> float:
        """The dense peak of the format in FLOP/s."""
        return self[fmt] * 1e12

    @property
    def bandwidth_Bps(self) -> float:
        return self.bandwidth_TBps * 1e12


# Dense (no sparsity) peaks of an H100 SXM5: https://glennklockwood.com/garden/processors/h100 (its table of
# theoretical TFLOPS). NVIDIA's H100 datasheet prints the tensor-core figures "with sparsity", exactly 2x these (1,979
# for BF16/FP16, 3,958 for FP8; archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html). FP32 66.9: no tensor cores.
# Bandwidth 3.35 TB/s (HBM3, 80 GB): NVIDIA's H100 product page (www.nvidia.com/en-us/data-center/h100/), its
# specifications table, H100 SXM column: "GPU Memory 80GB", "GPU Memory Bandwidth 3.35TB/s" (H100 NVL: 94GB, 3.9TB/s),
# read through public repositories that quote the table word for word (the page itself was not fetched for this
# course). The H200 (notebook 06's records) is the same chip with "GPU Memory 141GB", "GPU Memory Bandwidth 4.8TB/s"
# (www.nvidia.com/en-us/data-center/h200/, quoted the same way).
GPU_PEAKS = GPUPeaks(
    "H100 SXM",
    {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8 e4m3": 1978.9, "fp8 e5m2": 1978.9},
    3.35,
    "dense TFLOP/s: glennklockwood.com/garden/processors/h100 (NVIDIA's datasheet lists 2x, 'with sparsity'); "
    "3.35 TB/s: NVIDIA's H100 product page, specifications table (H100 SXM)",
)


def roofline_time(flops: float, bytes_moved: float, fmt: str, peaks: GPUPeaks = GPU_PEAKS) -> float:
    """Seconds for work of `flops` FLOPs moving `bytes_moved` bytes, at the peaks: the roofline (notebook 06).

    max(flops / peak FLOP/s of fmt, bytes_moved / bandwidth): whichever the work runs out of first. A lower bound;
    real kernels reach perhaps 60–80% of either peak.
    """
    if not isinstance(peaks, GPUPeaks):
        raise TypeError(f"peaks must be a GPUPeaks such as GPU_PEAKS, not {type(peaks).__name__}")
    for name, v in (("flops", flops), ("bytes_moved", bytes_moved)):
        if not (_finite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, not {v!r}")
    return max(flops / peaks.flops_per_s(fmt), bytes_moved / peaks.bandwidth_Bps)


@dataclass(frozen=True)
class MatmulPrediction:
    """The roofline's prediction for an n×n by n×n matmul in one format (notebook 06)."""

    n: int
    fmt: str
    flops: float  # 2n³
    bytes_moved: float  # 3n² elements: read A and B, write C, each once
    seconds: float
    bound: str  # "compute" or "memory"

    @property
    def tflops(self) -> float:
        """Achieved TFLOP/s: flops / seconds / 10^12."""
        return self.flops / self.seconds / 1e12

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved: 2n³ / (3n² · element size) = 2n / (3 · element size)."""
        return self.flops / self.bytes_moved


def matmul_prediction(n: int, fmt: str, peaks: GPUPeaks = GPU_PEAKS) -> MatmulPrediction:
    """Predicted time of an n×n×n matmul in fmt on the peaks' GPU: 2n³ FLOPs, 3n² elements moved (notebook 06).

    Each matrix crosses memory once at the format's storage size (tf32: 4 bytes, it is stored as fp32), output in
    the same format. Small n is memory-bound; above n ≈ 1.5 · peak / bandwidth · element size, compute-bound.
    """
    n = _count(n, "n")
    if n < 1:
        raise ValueError(f"n must be 1 or more, not {n}")
    f = _format(fmt)
    flops = 2.0 * n**3
    bytes_moved = 3.0 * n**2 * f.storage_bytes
    seconds = roofline_time(flops, bytes_moved, f.name, peaks)
    bound = "compute" if flops / peaks.flops_per_s(f.name) >= bytes_moved / peaks.bandwidth_Bps else "memory"
    return MatmulPrediction(n, f.name, flops, bytes_moved, seconds, bound)


def amdahl_speedup(fraction_sped_up: float, speedup: float) -> float:
    """The whole step's speedup when a fraction of its time goes `speedup` times faster: Amdahl's law (notebook 06).

    1 / ((1 − f) + f / s). With matmuls 70% of a step and 2x faster in bf16, the step is 1 / (0.3 + 0.35) ≈ 1.54x
    faster; however fast the matmuls, never more than 1 / 0.3 ≈ 3.3x.
    """
    if not (_finite(fraction_sped_up) and 0 <= fraction_sped_up <= 1):
        raise ValueError(f"fraction_sped_up must be a number in [0, 1], not {fraction_sped_up!r}")
    if not (_real(speedup) and speedup > 0 and not math.isnan(speedup)):
        raise ValueError(f"speedup must be a number > 0, not {speedup!r}")
    remaining = (1.0 - fraction_sped_up) + fraction_sped_up / speedup
    return math.inf if remaining == 0 else 1.0 / remaining
