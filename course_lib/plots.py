"""Matplotlib helpers the lessons reuse: memory breakdowns and measurement curves (notebook 01)."""

from __future__ import annotations

from typing import Mapping, Sequence

__all__ = ["memory_breakdown", "measurements"]

_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def memory_breakdown(bars: Mapping[str, Mapping[str, float]], *, unit: str = "MiB", title: str = "",
                     ax=None):
    """A stacked bar per setting (e.g. optimizer) of where memory goes, from {bar: {part: bytes}} (notebook 01)."""
    import matplotlib.pyplot as plt

    if unit not in _UNITS:
        raise ValueError(f"unit must be one of {', '.join(_UNITS)}, not {unit!r}")
    scale = _UNITS[unit]
    if ax is None:
        _, ax = plt.subplots(figsize=(1.6 + 1.4 * len(bars), 3.6))
    parts = list(dict.fromkeys(p for bar in bars.values() for p in bar))  # every part, in first-seen order
    names = list(bars)
    bottoms = [0.0] * len(names)
    for part in parts:
        heights = [bars[n].get(part, 0) / scale for n in names]
        ax.bar(names, heights, bottom=bottoms, label=part)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for i, total in enumerate(bottoms):
        ax.annotate(f"{total:.3g}", (i, total), ha="center", va="bottom", fontsize=9)
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.figure.tight_layout()
    return ax


def measurements(x: Sequence[float], series: Mapping[str, Sequence[float]], *, xlabel: str = "", ylabel: str = "",
                 title: str = "", logx: bool = False, logy: bool = False, ax=None):
    """Lines with markers of measured values against x, one per series, optionally on log axes (notebook 01)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 3.6))
    for label, ys in series.items():
        ax.plot(list(x), list(ys), marker="o", label=label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 1:
        ax.legend(frameon=False)
    ax.grid(alpha=0.3)
    ax.figure.tight_layout()
    return ax
