"""A pipeline schedule drawn, one row per device, and the explorer whose sliders redraw it (notebook 07).

    draw_schedule(ops)       one row per device, a box per op (F, B, W), idle time hatched; the bubble in the title
    schedule_explorer()      sliders and menus (stages, micro-batches, schedule, chunks) that simulate and redraw

The schedules themselves and their formulas are in schedules.py; matplotlib and ipywidgets are imported only when
something is drawn.
"""

from __future__ import annotations

import textwrap
from typing import Sequence

from course_lib.parallel import whole_number
from course_lib.parallel.pipeline.schedules import (_OP_KINDS, KINDS, Op, _check_ops, as_fraction_of_total,
                                                    as_ratio_to_ideal, bubble, gpipe_bubble, interleaved_bubble,
                                                    makespan, peak_in_flight, simulate)
from course_lib.tables import plural

__all__ = ["draw_schedule", "schedule_explorer"]

# Okabe–Ito hues, as course_lib.diagrams: forward blue, backward orange, weight gradient green.
COLOURS = {"F": "#0072B2", "B": "#E69F00", "W": "#009E73"}
_NAMES = {"F": "F forward", "B": "B backward", "W": "W weight gradient"}


def _picture(**kw):
    from course_lib.diagrams import Picture

    return Picture(**kw)


def _shade(colour: str, chunk: int, chunks: int) -> tuple[float, float, float]:
    """The colour for a chunk: chunk 0 as is, later chunks mixed towards white."""
    from matplotlib.colors import to_rgb

    mix = 0.0 if chunks <= 1 else 0.55 * chunk / (chunks - 1)
    return tuple(c + (1 - c) * mix for c in to_rgb(colour))


def draw_schedule(ops: Sequence[Op], title: str = "", *, unit: str | None = None):
    """A schedule's ops as boxes, one row per device, micro-batch number inside; idle time hatched (notebook 07).

    F blue, B orange, W green; in interleaved 1F1B a device's later chunks are lighter. unit: the time axis's unit
    ("ms" for a measured timeline); None: "units of one forward", simulate()'s default. Returns a matplotlib Figure
    (nothing in pyplot's state); its title gives the bubble.
    """
    from matplotlib.patches import Patch, Rectangle

    ops = _check_ops(ops)
    if not isinstance(title, str):
        raise TypeError(f"title must be a str, not {type(title).__name__}")
    devices = sorted({op.device for op in ops})
    chunks = max(op.chunk for op in ops) + 1
    t0, span = min(op.start for op in ops), makespan(ops)
    width_in = 11.0
    fig = _picture(figsize=(width_in, 1.4 + 0.45 * len(devices)), layout="constrained")
    ax = fig.subplots()
    points_per_unit = width_in * 72 * 0.85 / (span or 1)
    for row, device in enumerate(devices):
        ax.add_patch(Rectangle((t0, row - 0.4), span, 0.8, facecolor="#F4F4F4", edgecolor="#CCCCCC", hatch="///",
                               linewidth=0.5, zorder=1))  # idle unless covered by an op
        for op in (o for o in ops if o.device == device):
            ax.add_patch(Rectangle((op.start, row - 0.4), op.duration, 0.8, zorder=2, linewidth=0.6,
                                   facecolor=_shade(COLOURS[op.kind], op.chunk, chunks), edgecolor="white"))
            text = str(op.micro_batch)
            size = min(9.0, 0.9 * op.duration * points_per_unit / max(1, len(text)))
            if size >= 4.5:
                ax.text((op.start + op.end) / 2, row, text, ha="center", va="center", fontsize=size, zorder=3,
                        color="white" if op.kind != "B" and op.chunk * 2 < chunks else "black")
    stages_of = {d: sorted({op.stage for op in ops if op.device == d}) for d in devices}
    labels = [f"{d} / {', '.join(map(str, stages_of[d]))}" if stages_of[d] != [d] else str(d) for d in devices]
    ax.set_yticks(range(len(devices)), labels)
    ax.set_ylim(len(devices) - 0.5, -0.5)
    ax.set_xlim(t0, t0 + (span or 1) * 1.01)
    ax.set_xlabel(f"time ({unit})" if unit else "time (units of one forward)")
    ax.set_ylabel("device / stage")
    kinds = [k for k in _OP_KINDS if any(op.kind == k for op in ops)]
    names = dict(_NAMES, B="B backward (input gradient)") if "W" in kinds else _NAMES
    handles = [Patch(facecolor=COLOURS[k], label=names[k]) for k in kinds]
    if chunks > 1:
        handles.append(Patch(facecolor=_shade(COLOURS["F"], chunks - 1, chunks), label="lighter: later chunks"))
    handles.append(Patch(facecolor="#F4F4F4", edgecolor="#CCCCCC", hatch="///", label="idle (bubble)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    peak = max(peak_in_flight(ops).values())
    held = (f"{plural(peak, 'chunk')} (= {peak / chunks:.3g} micro-batches)" if chunks > 1
            else f"{plural(peak, 'micro-batch')}")
    summary = (f"bubble {bubble(ops):.1%} of device time · makespan {span:.3g}"
               f"{' ' + unit if unit else ''} · peak in flight {held}")
    ax.set_title(f"{title}\n{summary}" if title else summary, fontsize=10, loc="left")
    ax.grid(axis="x", alpha=0.3)
    return fig


def _formula_lines(kind: str, p: int, m: int, v: int, simulated: float) -> list[str]:
    if kind in ("gpipe", "1f1b"):
        return [f"bubble: simulated {simulated:.1%} of device time; GPipe's formula (p−1)/(m+p−1) = "
                f"{gpipe_bubble(p, m):.1%}"]
    if kind == "interleaved-1f1b":
        ratio = interleaved_bubble(p, m, v)
        return [f"bubble: simulated {simulated:.1%} of device time = {as_ratio_to_ideal(simulated):.3f} × ideal",
                f"Narayanan et al.: (p−1)/(v·m) = {ratio:.3f} × ideal = {as_fraction_of_total(ratio):.1%} of total "
                f"(1F1B: {gpipe_bubble(p, m):.1%})"]
    lines = [f"bubble: simulated {simulated:.1%} of device time; 1F1B at the same p, m: "
             f"{bubble(simulate('1f1b', p, m)):.1%} (W fills what 1F1B leaves idle)"]
    if m >= p:  # Qi et al.: with T_F = T_B = T_W (here 1 each), ZB-H1's bubble is a third of 1F1B's, (p−1)/(3m)
        third = interleaved_bubble(p, m) / 3
        lines.append(f"Qi et al.: a third of 1F1B's, (p−1)/(3m) = {third:.3f} × ideal = "
                     f"{as_fraction_of_total(third):.1%} of total")
    return lines


def schedule_explorer(stages: int = 4, micro_batches: int = 8, kind: str = "1f1b", chunks: int = 2):
    """Sliders for stages and micro-batches, menus for the schedule and chunks, redrawing the schedule (notebook 07).

    Under the picture: the bubble simulated and by formula, and the peak number of micro-batches in flight on each
    device (the activations it holds). Times: forward 1, backward 2. Returns the ipywidgets VBox; its .ops are the
    ops last drawn (None when the settings were refused, e.g. interleaved with m not a multiple of p).
    """
    import ipywidgets as widgets
    from IPython.display import display

    if kind not in KINDS:
        raise ValueError(f"unknown schedule {kind!r}: use one of {', '.join(map(repr, KINDS))}")
    wide = {"description_width": "initial"}
    stage_slider = widgets.IntSlider(value=whole_number(stages, "stages"), min=1, max=8, description="stages (devices)",
                                     style=wide)
    mb_slider = widgets.IntSlider(value=whole_number(micro_batches, "micro_batches"), min=1, max=16,
                                  description="micro-batches", style=wide)
    menu = widgets.Dropdown(options=[("GPipe", "gpipe"), ("1F1B", "1f1b"), ("interleaved 1F1B", "interleaved-1f1b"),
                                     ("zero bubble (ZB-H1)", "zero-bubble")], value=kind, description="schedule",
                            style=wide)
    chunk_slider = widgets.IntSlider(value=whole_number(chunks, "chunks"), min=1, max=4,
                                     description="chunks per device", style=wide)
    out = widgets.Output()
    box = widgets.VBox([widgets.HBox([stage_slider, mb_slider]), widgets.HBox([menu, chunk_slider]), out])
    box.ops = None

    def redraw(change=None):
        p, m, k = stage_slider.value, mb_slider.value, menu.value
        v = chunk_slider.value if k == "interleaved-1f1b" else 1
        chunk_slider.disabled = k != "interleaved-1f1b"
        with out:
            out.clear_output(wait=True)
            try:
                ops = simulate(k, p, m, chunks=v)
            except ValueError as error:
                box.ops = None
                print(textwrap.fill(f"not drawn: {error}", 100, subsequent_indent="  "))
                return
            box.ops = ops
            name = dict((value, label) for label, value in menu.options)[k]
            display(draw_schedule(ops, f"MODEL · {name}, {plural(p, 'stage')}, {plural(m, 'micro-batch')}"
                                       + (f", {plural(v, 'chunk')} per device" if k == "interleaved-1f1b" else "")
                                       + " (forward 1, backward 2)"))
            held = peak_in_flight(ops)
            unit = f"chunks of 1/{v} micro-batch" if v > 1 else "micro-batches whose activations it holds"
            lines = _formula_lines(k, p, m, v, bubble(ops))
            lines.append(f"peak in flight per device ({unit}): " + ", ".join(f"{d}: {n}" for d, n in held.items()))
            for line in lines:
                print(textwrap.fill(line, 100, subsequent_indent="  "))

    for control in (stage_slider, mb_slider, menu, chunk_slider):
        control.observe(redraw, names="value")
    redraw()
    return box

