"""Pipeline parallelism: schedules simulated and drawn, bubbles by formula, a model split by hand (notebook 07).

    Op, simulate(kind, stages, m, ...)   a schedule played out op by op: GPipe, 1F1B, interleaved 1F1B, zero bubble
    bubble, makespan, peak_in_flight     what a schedule costs: idle device time, length, activations held
    gpipe_bubble, interleaved_bubble     the published formulas (GPipe; Narayanan et al. 2021)
    as_fraction_of_total, as_ratio_to_ideal   between "bubble / total time" and "bubble / ideal time"
    draw_schedule(ops), schedule_explorer()    one row per device, boxes per op; sliders that redraw it
    stage_costs, split_by_boundaries, stage_times   each layer's cost measured; a model cut into stages, timed
    naive_split, NaiveSplit, timeline_of_naive_split   consecutive layers on consecutive devices, and when each works

The simulation is a model: fixed op durations, no launch costs, a transfer costs comm_time and nothing else.
benchmarks/pipeline_step.py measures torch.distributed.pipelining on gloo ranks against it. Exercise 07's
partitioning of layers into balanced stages is not here: stage_costs and stage_times give it its inputs.
"""

from __future__ import annotations

import math
import numbers
import statistics
import textwrap
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from course_lib.parallel import whole_number
from course_lib.tables import plural

__all__ = ["Op", "KINDS", "simulate", "bubble", "makespan", "peak_in_flight", "gpipe_bubble", "interleaved_bubble",
           "as_fraction_of_total", "as_ratio_to_ideal", "draw_schedule", "schedule_explorer", "stage_costs",
           "split_by_boundaries", "stage_times", "NaiveSplit", "naive_split", "timeline_of_naive_split"]

# The schedules simulate() knows, with where each comes from.
KINDS: dict[str, str] = {
    "gpipe": "GPipe (Huang et al. 2019, arXiv:1811.06965): every micro-batch's forward, then every backward "
             "(all-forward-all-backward); torch's ScheduleGPipe",
    "1f1b": "1F1B (PipeDream-Flush; Narayanan et al. 2021, arXiv:2104.04473 §2.2.1): min(m, p - s) warm-up forwards, "
            "then one backward and one forward while forwards remain, then the other backwards: torch's "
            "Schedule1F1B._step_microbatches (Megatron-LM states the same order as p - s - 1 warm-up forwards, "
            "then one forward and one backward)",
    "interleaved-1f1b": "interleaved 1F1B (Narayanan et al. 2021, arXiv:2104.04473 §2.2.2): each device holds "
                        "`chunks` non-consecutive stages (virtual stages); torch's ScheduleInterleaved1F1B",
    "zero-bubble": "ZB-H1 (Qi et al. 2023, 'Zero Bubble Pipeline Parallelism', arXiv:2401.10241, its handcrafted "
                   "memory-efficient schedule): backward split into B (input gradient) and W (weight gradient), W "
                   "filling the bubbles; the op order of torch's ScheduleInterleavedZeroBubble with one stage per "
                   "device (torch: 'the ZB1P schedule in the paper')",
}

_OP_KINDS = ("F", "B", "W")


def _real(x) -> bool:
    """A finite real number (numpy's too), not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)



def _seconds(x, what: str, *, positive: bool) -> float:
    if not _real(x):
        raise ValueError(f"{what} must be a finite number, not {x!r}")
    if x < 0 or (positive and x == 0):
        raise ValueError(f"{what} must be {'> 0' if positive else '>= 0'}, not {x!r}")
    return float(x)


# ---------------------------------------------------------------------------------------------------- schedules


@dataclass(frozen=True)
class Op:
    """One piece of a pipeline schedule: a micro-batch's forward or backward through one stage (notebook 07).

    kind: "F" forward; "B" backward (for zero bubble: the input gradient only); "W" the weight gradient (zero
    bubble only). stage: the model's stage, counted from the input; in interleaved 1F1B a virtual stage (device d
    holds stages d, d + p, d + 2p, ... of p·chunks). device: the device that runs it (the stage itself unless
    interleaved), chunk: which of its device's stages it is (0 unless interleaved). start, end: in any one unit.
    """

    stage: int
    micro_batch: int
    kind: str
    start: float
    end: float
    device: int | None = None
    chunk: int = 0

    def __post_init__(self):
        if self.kind not in _OP_KINDS:
            raise ValueError(f"kind must be one of {', '.join(_OP_KINDS)}, not {self.kind!r}")
        for name in ("stage", "micro_batch", "chunk"):
            whole_number(getattr(self, name), name, 0, integral_floats=False)
        if self.device is None:
            object.__setattr__(self, "device", self.stage)
        whole_number(self.device, "device", 0, integral_floats=False)
        if not (_real(self.start) and _real(self.end) and self.end >= self.start):
            raise ValueError(f"need finite times with end >= start, not start={self.start!r}, end={self.end!r}")

    @property
    def duration(self) -> float:
        return self.end - self.start


def _device_orders(kind: str, p: int, m: int, v: int) -> list[list[tuple[int, int, str]]]:
    """The ops each device runs, in the order it runs them: (stage, micro-batch, kind)."""
    orders = []
    for d in range(p):
        if kind == "gpipe":  # torch's ScheduleGPipe: all forwards, then the backwards in the same order
            order = [(d, i, "F") for i in range(m)] + [(d, i, "B") for i in range(m)]
        elif kind == "1f1b":  # torch's Schedule1F1B: min(m, p − d) forwards, then B, F, B, F, ..., then the rest of B
            warmup = min(m, p - d)
            order = [(d, i, "F") for i in range(warmup)]
            for i in range(m):
                order.append((d, i, "B"))
                if warmup + i < m:
                    order.append((d, warmup + i, "F"))
        else:  # torch's _get_1f1b_rank_ops, as ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble call it
            zero_bubble = kind == "zero-bubble"
            # warm-up forwards: (v − 1)·p + 2(p − 1 − d) for interleaved (Megatron-LM's), p − 1 − d for ZB-H1
            warmup = min((v - 1) * p + (1 if zero_bubble else 2) * (p - 1 - d), m * v)
            delayed_w = d if zero_bubble else None  # ZB-H1: device d holds back its first d weight gradients
            next_mb: dict[tuple[int, str], int] = {}

            def take(stage, what):
                i = next_mb.get((stage, what), 0)
                next_mb[(stage, what)] = i + 1
                return stage, i, what

            def forward_stage(step):
                return ((step // p) % v) * p + d

            def backward_stage(step):
                return (v - 1 - ((step - warmup) // p) % v) * p + d

            order, backwards, weights_done = [], [], 0
            for step in range(m * v + warmup):  # warm-up forwards, m·v − warmup pairs F B, warmup cool-down B
                if step < m * v:
                    order.append(take(forward_stage(step), "F"))
                if step >= warmup:
                    order.append(take(backward_stage(step), "B"))
                    backwards.append(backward_stage(step))
                    if zero_bubble and step - warmup >= delayed_w:
                        order.append(take(backwards[weights_done], "W"))
                        weights_done += 1
            if zero_bubble:
                order += [take(stage, "W") for stage in backwards[weights_done:]]
        orders.append(order)
    return orders


def simulate(kind: str, stages: int, micro_batches: int, *, forward_time: float = 1.0, backward_time: float = 2.0,
             chunks: int = 1, comm_time: float = 0.0) -> list[Op]:
    """Play out a pipeline schedule op by op; return every op with its start and end (notebook 07).

    kind: "gpipe", "1f1b", "interleaved-1f1b" or "zero-bubble" (KINDS says where each comes from); stages: p
    devices; micro_batches: m. forward_time, backward_time: one micro-batch through one device's share of the model
    (backward about twice forward: it computes the gradient of the input and of the weights). chunks (interleaved
    only): v stages per device, each 1/v of the device's layers, so each of its ops takes 1/v of the time. For zero
    bubble the backward is split into B (input gradient) and W (weight gradient), each half of backward_time.

    Each device runs its ops in the schedule's order (torch's order for each kind), each as soon as the device is
    free and its input is there: F of stage s after F of stage s − 1 has ended plus comm_time (the activation's
    trip), B of stage s after B of stage s + 1 plus comm_time (the gradient's trip back), B of the last stage after
    its own F, W after its B. Nothing is sent between two stages on the same device. Ops come back sorted by start.

    An event-driven simulation with fixed op times. torch's Schedule1F1B refuses m < p; simulate runs it (GPipe's
    bubble, in another order). Interleaved 1F1B needs micro_batches a multiple of stages: its schedule takes the
    micro-batches in rounds of p (Narayanan et al. §2.2.2; Megatron-LM refuses other counts). torch 2.14's
    ScheduleInterleaved1F1B is looser: max(1, m // p) rounds, m a multiple of the number of rounds.
    """
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a schedule's name, one of {', '.join(map(repr, KINDS))}, not "
                        f"{type(kind).__name__}")
    if kind not in KINDS:
        raise ValueError(f"unknown schedule {kind!r}: use one of {', '.join(map(repr, KINDS))}")
    p = whole_number(stages, "stages")
    m = whole_number(micro_batches, "micro_batches")
    v = whole_number(chunks, "chunks")
    f = _seconds(forward_time, "forward_time", positive=True)
    b = _seconds(backward_time, "backward_time", positive=True)
    c = _seconds(comm_time, "comm_time", positive=False)
    if kind != "interleaved-1f1b" and v != 1:
        raise ValueError(f"chunks (stages per device) is for 'interleaved-1f1b' only; {kind!r} has 1 per device, "
                         f"not {v}")
    if kind == "interleaved-1f1b" and m % p:
        raise ValueError(f"interleaved 1F1B takes micro-batches in rounds of one per device: micro_batches must be a "
                         f"multiple of stages ({p}), not {m}; try {p * max(1, round(m / p))}")
    duration = {"F": f / v, "B": b / v, "W": 0.0}
    if kind == "zero-bubble":
        duration["B"] = duration["W"] = b / 2
    last = p * v - 1
    orders = _device_orders(kind, p, m, v)
    ends: dict[tuple[int, int, str], float] = {}
    ops: list[Op] = []
    position, free = [0] * p, [0.0] * p

    def ready(stage: int, i: int, what: str) -> float | None:
        """When the op's input is on its device; None while it is not computed yet."""
        if what == "F":
            before = (stage - 1, i, "F") if stage > 0 else None
        elif what == "B":
            before = (stage + 1, i, "B") if stage < last else (stage, i, "F")
        else:
            before = (stage, i, "B")
        if before is None:
            return 0.0
        if before not in ends:
            return None
        moved = before[0] % p != stage % p  # from another device: one transfer
        return ends[before] + (c if moved else 0.0)

    progress = True
    while progress:
        progress = False
        for d in range(p):
            while position[d] < len(orders[d]):
                stage, i, what = orders[d][position[d]]
                arrival = ready(stage, i, what)
                if arrival is None:
                    break  # waits for another device
                start = max(free[d], arrival)
                end = start + duration[what]
                ends[(stage, i, what)] = end
                ops.append(Op(stage, i, what, start, end, device=d, chunk=stage // p))
                free[d] = end
                position[d] += 1
                progress = True
    if any(position[d] < len(orders[d]) for d in range(p)):  # a schedule whose order waits on itself
        raise RuntimeError(f"the {kind} schedule deadlocked at p={p}, m={m}, chunks={v}: a bug in the schedule")
    return sorted(ops, key=lambda op: (op.start, op.device))


def _check_ops(ops) -> list[Op]:
    ops = list(ops)
    if not ops:
        raise ValueError("ops is empty: pass what simulate() or timeline_of_naive_split() returned")
    for op in ops:
        if not isinstance(op, Op):
            raise TypeError(f"ops must be Op objects (from simulate), not {type(op).__name__}")
    return ops


def makespan(ops: Sequence[Op]) -> float:
    """Time from the first op's start to the last op's end: one training step's pipeline (notebook 07)."""
    ops = _check_ops(ops)
    return max(op.end for op in ops) - min(op.start for op in ops)


def bubble(ops: Sequence[Op]) -> float:
    """The idle fraction of device time between the first start and the last end, over every device (notebook 07).

    1 − (time spent in ops) / (devices × makespan): GPipe's "bubble" as a fraction of the total time. A device
    counts if it runs at least one op. 0 for a schedule that never waits.
    """
    ops = _check_ops(ops)
    span = makespan(ops)
    if span == 0:
        return 0.0
    devices = {op.device for op in ops}
    return max(0.0, 1.0 - sum(op.duration for op in ops) / (len(devices) * span))


def peak_in_flight(ops: Sequence[Op]) -> dict[int, int]:
    """Per device, the most micro-batches forwarded but not yet backwarded: the activations it holds (notebook 07).

    A micro-batch's activations on a stage are kept from its forward's start until its last backward op there ends
    (W where the backward is split: the weight gradient still needs the layer inputs). GPipe holds all m; 1F1B at
    most p on the first device. In interleaved 1F1B each count is one (micro-batch, chunk) pair, which holds 1/chunks
    of a micro-batch's activations on that device: divide by chunks for micro-batches' worth.
    """
    ops = _check_ops(ops)
    release = {}
    for op in ops:  # the op that ends each (stage, micro-batch)'s life: its W if it has one, else its B
        key = (op.stage, op.micro_batch)
        if op.kind == "W" or (op.kind == "B" and release.get(key) != "W"):
            release[key] = op.kind
    held: dict[int, int] = {}
    peak: dict[int, int] = {}
    for op in sorted(ops, key=lambda o: (o.start, o.end)):
        peak.setdefault(op.device, 0)
        if op.kind == "F":
            held[op.device] = held.get(op.device, 0) + 1
            peak[op.device] = max(peak[op.device], held[op.device])
        elif release.get((op.stage, op.micro_batch)) == op.kind:
            held[op.device] = held.get(op.device, 0) - 1
    return dict(sorted(peak.items()))


# ---------------------------------------------------------------------------------------------------- formulas


def _p_m(p, m) -> tuple[int, int]:
    return whole_number(p, "p (stages)"), whole_number(m, "m (micro-batches)")


def gpipe_bubble(p: int, m: int) -> float:
    """(p − 1) / (m + p − 1): the bubble as a fraction of the total time, GPipe and 1F1B alike (notebook 07).

    Huang et al. 2019, GPipe, arXiv:1811.06965 §2.3: "This bubble time is O((K−1)/(M+K−1))" (K partitions, M
    micro-batches), "negligible when M ≥ 4 × K": each device is idle p − 1 of the m + p − 1 forward slots, and
    again of the backward ones. simulate() gives exactly this for GPipe and 1F1B, whatever the forward and backward
    times, when nothing is sent (comm_time 0).
    """
    p, m = _p_m(p, m)
    return (p - 1) / (m + p - 1)


def interleaved_bubble(p: int, m: int, v: int = 1) -> float:
    """(p − 1) / (v·m): interleaved 1F1B's bubble as a ratio to the ideal time, NOT to the total (notebook 07).

    Narayanan et al. 2021, arXiv:2104.04473 §2.2: the bubble of 1F1B is (p − 1)(t_f + t_b), the ideal time
    m(t_f + t_b), so "bubble time fraction" = (p − 1)/m; with v stages per device each op is v times shorter and the
    bubble is (1/v)(p − 1)/m. v = 1 is plain 1F1B (and GPipe). as_fraction_of_total turns it into gpipe_bubble's
    measure: (p − 1)/(v·m + p − 1). simulate("interleaved-1f1b", ...) gives exactly this (m a multiple of p,
    comm_time 0, whatever the forward and backward times).
    """
    p, m = _p_m(p, m)
    v = whole_number(v, "v (chunks per device)")
    return (p - 1) / (v * m)


def as_fraction_of_total(ratio_to_ideal: float) -> float:
    """bubble/ideal → bubble/total: r / (1 + r), since total = ideal + bubble (notebook 07)."""
    r = _seconds(ratio_to_ideal, "ratio_to_ideal", positive=False)
    return r / (1 + r)


def as_ratio_to_ideal(fraction_of_total: float) -> float:
    """bubble/total → bubble/ideal: f / (1 − f); the inverse of as_fraction_of_total (notebook 07)."""
    f = _seconds(fraction_of_total, "fraction_of_total", positive=False)
    if f >= 1:
        raise ValueError(f"fraction_of_total must be below 1 (a bubble is part of the total), not {f!r}")
    return f / (1 - f)


# ---------------------------------------------------------------------------------------------------- pictures

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
    held = f"{plural(peak, 'chunk')} (= {peak / chunks:.3g} micro-batches)" if chunks > 1 else f"{plural(peak, 'micro-batch')}"
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
    chunk_slider = widgets.IntSlider(value=whole_number(chunks, "chunks"), min=1, max=4, description="chunks per device",
                                     style=wide)
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


# ---------------------------------------------------------------------------------------------------- real models


def _check_sequential(model) -> nn.Sequential:
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"model must be an nn.Sequential (a stack of layers to cut), not {type(model).__name__}")
    if len(model) == 0:
        raise ValueError("model is an empty nn.Sequential: give it at least one layer")
    return model


def _check_input(x, what: str = "example_input") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a tensor (one batch for the model), not {type(x).__name__}")
    return x


def _sync(*tensors) -> None:
    for device in {t.device for t in tensors if isinstance(t, torch.Tensor)}:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def _trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def _time_forward_backward(module: nn.Module, x: torch.Tensor, input_grad: bool, repeat: int):
    """Median forward and backward seconds of module on x (after one warm-up), and its output (detached).

    The backward is torch.autograd.grad of the output (times a fixed random gradient) with respect to the module's
    trainable parameters and, when input_grad, its input: the work a pipeline stage does, leaving .grad alone.
    """
    forward, backward = [], []
    inp = x.detach().requires_grad_(input_grad)
    params = _trainable(module)
    out = None
    for r in range(repeat + 1):
        _sync(inp)
        t0 = time.perf_counter()
        out = module(inp)
        _sync(out)
        t1 = time.perf_counter()
        wrt = params + ([inp] if input_grad else [])
        if isinstance(out, torch.Tensor) and out.requires_grad and wrt:
            grad = torch.ones_like(out)
            torch.autograd.grad(out, wrt, grad, allow_unused=True)
            _sync(out)
        t2 = time.perf_counter()
        if r:  # the first run warms up
            forward.append(t1 - t0)
            backward.append(t2 - t1)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"each layer must return one tensor, {type(module).__name__} returned {type(out).__name__}")
    return statistics.median(forward), statistics.median(backward), out.detach()


def stage_costs(model: nn.Sequential, example_input: torch.Tensor, repeat: int = 3) -> list[dict]:
    """Each layer's parameter count and measured forward and backward seconds, on its real input (notebook 07).

    Runs the layers in order on example_input, timing each one on what the layer before it produced (median of
    repeat runs after one warm-up; on a GPU with synchronisation). The backward computes the gradients of the
    layer's weights and, after the first layer with trainable weights, of its input, as in training; .grad is left
    alone. One dict per layer: layer (index), name (its class), parameters, forward_s, backward_s, seconds (the sum).
    """
    model = _check_sequential(model)
    x = _check_input(example_input)
    repeat = whole_number(repeat, "repeat")
    rows, upstream_trainable = [], False
    for index, layer in enumerate(model):
        input_grad = upstream_trainable and x.is_floating_point()
        forward, backward, x = _time_forward_backward(layer, x, input_grad, repeat)
        rows.append({"layer": index, "name": type(layer).__name__,
                     "parameters": sum(p.numel() for p in layer.parameters()),
                     "forward_s": forward, "backward_s": backward, "seconds": forward + backward})
        upstream_trainable = upstream_trainable or bool(_trainable(layer))
    return rows


def split_by_boundaries(model: nn.Sequential, boundaries: Sequence[int]) -> list[nn.Sequential]:
    """The model cut before each boundary index: [4] cuts 8 layers into layers 0–3 and 4–7 (notebook 07).

    Each piece is an nn.Sequential of the same layer objects (not copies), with their names (model[a:b]).
    boundaries: strictly increasing indices between 1 and len(model) − 1; [] gives the whole model as one piece.
    """
    model = _check_sequential(model)
    if isinstance(boundaries, (str, bytes)) or not isinstance(boundaries, Sequence):
        raise TypeError(f"boundaries must be a list of layer indices, not {type(boundaries).__name__}")
    cuts = [whole_number(b, "a boundary", 1, integral_floats=False) for b in boundaries]
    if any(b >= len(model) for b in cuts):
        raise ValueError(f"boundaries must lie between 1 and {len(model) - 1} (the model has "
                         f"{plural(len(model), 'layer')}), not {cuts}")
    if any(a >= b for a, b in zip(cuts, cuts[1:])):
        raise ValueError(f"boundaries must be strictly increasing, not {cuts}")
    edges = [0] + cuts + [len(model)]
    return [model[a:b] for a, b in zip(edges, edges[1:])]


def stage_times(stages_modules: Sequence[nn.Module], example_input: torch.Tensor, repeat: int = 3) -> list[float]:
    """Measured forward + backward seconds of each stage, each on the output of the one before (notebook 07).

    As stage_costs does for layers (median of repeat after a warm-up; input gradients from the second stage on,
    when something upstream is trainable): the slowest stage sets a pipeline's pace.
    """
    if isinstance(stages_modules, nn.Module) or not isinstance(stages_modules, Sequence) or not stages_modules:
        raise TypeError("stages_modules must be a non-empty list of modules (split_by_boundaries gives one)")
    for stage in stages_modules:
        if not isinstance(stage, nn.Module):
            raise TypeError(f"each stage must be an nn.Module, not {type(stage).__name__}")
    x = _check_input(example_input)
    repeat = whole_number(repeat, "repeat")
    seconds, upstream_trainable = [], False
    for stage in stages_modules:
        forward, backward, x = _time_forward_backward(stage, x, upstream_trainable and x.is_floating_point(), repeat)
        seconds.append(forward + backward)
        upstream_trainable = upstream_trainable or bool(_trainable(stage))
    return seconds


# ---------------------------------------------------------------------------------------------------- naive split


class NaiveSplit(nn.Module):
    """Consecutive layers on consecutive devices; forward moves the activations along (notebook 07).

    .stages: the pieces (nn.Sequential); .devices: where each one lives; .description: one line saying where they
    are, and whether they are real GPUs or CPU stand-ins. Autograd carries the gradients back across the devices.
    Only one device works at a time: that idle time is what pipelining recovers.
    """

    def __init__(self, stages: Sequence[nn.Sequential], devices: Sequence[torch.device], description: str):
        super().__init__()
        self.stages = nn.ModuleList(stages)
        self.devices = [torch.device(d) for d in devices]
        self.description = description

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage, device in zip(self.stages, self.devices):
            x = stage(x.to(device))
        return x


def naive_split(model: nn.Sequential, devices: Sequence | None = None, *,
                boundaries: Sequence[int] | None = None) -> NaiveSplit:
    """Put consecutive layers of model on consecutive devices: the naive model parallelism (notebook 07).

    devices: None for two: cuda:0 and cuda:1 where there are 2 GPUs, else two CPU stand-ins ("cpu", "cpu"),
    which .description says. boundaries (split_by_boundaries): where each piece starts; None cuts the layers into
    equal counts, the first pieces one longer. The layers are moved, not copied: model itself changes device.
    """
    model = _check_sequential(model)
    if devices is None:
        on_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= 2
        devices = ["cuda:0", "cuda:1"] if on_gpus else ["cpu", "cpu"]
    if isinstance(devices, (str, torch.device)) or not isinstance(devices, Sequence):
        raise TypeError(f"devices must be a list of devices, like ['cuda:0', 'cuda:1'], not {devices!r}")
    try:
        devices = [torch.device(d) for d in devices]
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"devices must name devices, like 'cuda:0' or 'cpu': {error}") from None
    if len(devices) < 1:
        raise ValueError("devices is empty: give one device per stage")
    if len(devices) > len(model):
        raise ValueError(f"{plural(len(devices), 'device')} but only {plural(len(model), 'layer')}: "
                         "every stage needs at least one layer")
    if boundaries is None:
        k, n = len(devices), len(model)
        sizes = [n // k + (i < n % k) for i in range(k)]
        boundaries = [sum(sizes[:i]) for i in range(1, k)]
    stages = split_by_boundaries(model, boundaries)
    if len(stages) != len(devices):
        raise ValueError(f"{plural(len(boundaries), 'boundary')} make {plural(len(stages), 'stage')} for "
                         f"{plural(len(devices), 'device')}: give one stage per device")
    for stage, device in zip(stages, devices):
        stage.to(device)
    names = ", ".join(str(d) for d in devices)
    counts = " + ".join(str(len(s)) for s in stages)
    what = f"{plural(len(stages), 'stage')} (layers: {counts}) on {names}"
    if all(d.type == "cpu" for d in devices):
        description = (f"{what}: CPU stand-ins for {plural(len(stages), 'GPU')} (fewer than {plural(len(stages), 'GPU')} here); "
                       "they take turns as GPUs would, but share this CPU's cores")
    elif len(set(devices)) == len(devices):
        description = f"{what}: forward moves the activations from each device to the next"
    else:
        description = f"{what}: some stages share a device"

    return NaiveSplit(stages, devices, description)


def timeline_of_naive_split(split: NaiveSplit, inputs: torch.Tensor, targets: torch.Tensor | None = None, *,
                            steps: int = 3, loss_fn: Callable | None = None) -> list[Op]:
    """When each stage of a NaiveSplit computes, measured over a few training steps: Ops in ms (notebook 07).

    Each step: the forward stage by stage (F, including the move of the activations onto the stage's device), the
    loss, then the backward stage by stage from the last (B: the gradients of the stage's weights and of its input,
    which goes to the stage before). Wall-clock times (with synchronisation on a GPU), in ms from the first op;
    Op.micro_batch is the step. One warm-up step is not recorded. Draw with draw_schedule(ops, unit="ms"): one row
    per stage, and only one works at a time. loss_fn(output, targets): MSE by default; targets None: zeros.
    .grad is left alone (torch.autograd.grad).
    """
    if not isinstance(split, NaiveSplit):
        raise TypeError(f"split must be a NaiveSplit (from naive_split), not {type(split).__name__}")
    inputs = _check_input(inputs, "inputs")
    steps = whole_number(steps, "steps")
    loss_fn = loss_fn or nn.functional.mse_loss
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, not {type(loss_fn).__name__}")
    ops: list[tuple[int, int, str, float, float]] = []
    for step in range(-1, steps):
        outputs, kept = [], []
        x = inputs
        for index, (stage, device) in enumerate(zip(split.stages, split.devices)):
            _sync(x)
            t0 = time.perf_counter()
            inp = x.detach().to(device).requires_grad_(index > 0 and x.is_floating_point())
            out = stage(inp)
            _sync(out)
            ops.append((index, step, "F", t0, time.perf_counter()))
            kept.append(inp)
            outputs.append(out)
            x = out
        goal = torch.zeros_like(x) if targets is None else targets.to(x.device)
        grad = torch.autograd.grad(loss_fn(x, goal), x)[0]
        for index in reversed(range(len(split.stages))):
            stage, inp, out = split.stages[index], kept[index], outputs[index]
            _sync(grad)
            t0 = time.perf_counter()
            wrt = _trainable(stage) + ([inp] if inp.requires_grad else [])
            if wrt and out.requires_grad:
                grads = torch.autograd.grad(out, wrt, grad.to(out.device), allow_unused=True)
                grad = grads[-1] if inp.requires_grad else None
            _sync(out)
            ops.append((index, step, "B", t0, time.perf_counter()))
            if grad is None:
                break
    recorded = [o for o in ops if o[1] >= 0]
    t0 = min(o[3] for o in recorded)
    return [Op(stage, step, kind, (start - t0) * 1e3, (end - t0) * 1e3) for stage, step, kind, start, end in recorded]
