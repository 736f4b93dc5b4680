"""Asynchronous execution and streams: the copy/compute schedule model and timelines (notebook 02).

    copy_compute_schedule(...)  the model: when each copy and compute of n batches runs, one after the other or overlapped
    draw_timeline(spans, ...)   lanes of bars (engines, streams, threads) of a schedule, modelled or measured
    profiler_spans(prof, ...)   spans of the work a torch.profiler run recorded: CPU ops by thread, GPU work by stream
    draw_schedules(c, k, n)     both schedules of the model, one above the other, with their totals
    schedule_explorer(...)      sliders for copy time, compute time and batches that redraw the model (ipywidgets)

Exercise 02's pipeline_time is the closed formula for the model's total; here the schedule is played out batch
by batch, to be drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from course_lib.tables import plural

__all__ = ["Span", "copy_compute_schedule", "draw_timeline", "draw_schedules", "profiler_spans",
           "schedule_explorer"]

@dataclass(frozen=True)
class Span:
    """One piece of work on a timeline: its lane (an engine, a stream, a thread), a label, and when it ran (notebook 02)."""

    lane: str
    label: str
    start: float
    end: float
    kind: str = "other"  # "copy", "compute" or "other": sets the colour

    @property
    def duration(self) -> float:
        return self.end - self.start


def copy_compute_schedule(n_batches: int, copy: float, compute: float, *, overlapped: bool) -> list[Span]:
    """The model lesson 02 draws: n batches, each copied to the device and then computed on (notebook 02).

    One after the other (overlapped=False), one queue runs copy 0, compute 0, copy 1, ... Overlapped, the copies
    run back to back on the copy engine, and compute i starts once copy i and compute i-1 are both done. Times
    are in any one unit. A model: no launch costs, no contention between the two engines.
    """
    if n_batches < 0 or copy < 0 or compute < 0:
        raise ValueError(f"need n_batches >= 0 and times >= 0, got {n_batches}, {copy}, {compute}")
    spans, copy_done, compute_done = [], 0.0, 0.0
    for i in range(n_batches):
        copy_start = copy_done if overlapped else compute_done
        copy_done = copy_start + copy
        compute_start = max(copy_done, compute_done)
        compute_done = compute_start + compute
        spans.append(Span("copy engine", f"copy {i}", copy_start, copy_done, "copy"))
        spans.append(Span("compute", f"compute {i}", compute_start, compute_done, "compute"))
    return spans


_COLOURS = {"copy": "tab:orange", "compute": "tab:blue", "other": "tab:gray"}


def draw_timeline(spans: Sequence[Span], *, ax=None, title: str = "", unit: str = "ms",
                  lanes: Sequence[str] | None = None, xmax: float | None = None):
    """Draw spans as bars, one labelled lane per row, with the end of the last one marked (notebook 02).

    Copies are orange and compute blue; a legend says so when a lane holds both.
    """
    import matplotlib.pyplot as plt

    lanes = list(lanes) if lanes is not None else list(dict.fromkeys(s.lane for s in spans))
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.2 + 0.55 * len(lanes)), layout="constrained")
    end = max((s.end for s in spans), default=0.0)
    width_of_axis = xmax or end or 1.0
    for row, lane in enumerate(lanes):
        for s in (s for s in spans if s.lane == lane):
            ax.broken_barh([(s.start, s.duration)], (row - 0.35, 0.7), facecolors=_COLOURS.get(s.kind, "tab:gray"),
                           edgecolor="white", linewidth=0.8)
            share = s.duration / width_of_axis  # label a bar only if the text fits: all of it, or its last word
            label = s.label if share > 0.012 * len(s.label) else s.label.split()[-1] if share > 0.02 else ""
            ax.text((s.start + s.end) / 2, row, label, ha="center", va="center", fontsize=8, color="white")
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlim(0, xmax or (end * 1.02 if end else 1))
    ax.axvline(end, color="black", linestyle=":", linewidth=1)
    ax.annotate(f"{end:.3g} {unit}", (end, -0.5), xytext=(3, 2), textcoords="offset points", fontsize=8, va="bottom")
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(title, fontsize=10, loc="left")
    ax.grid(axis="x", alpha=0.3)
    if any(len({s.kind for s in spans if s.lane == lane}) > 1 for lane in lanes):  # colours alone tell kinds apart
        from matplotlib.patches import Patch

        kinds = list(dict.fromkeys(s.kind for s in spans))
        ax.legend([Patch(color=_COLOURS.get(k, "tab:gray")) for k in kinds], kinds, loc="upper left",
                  bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    return ax


def profiler_spans(prof, *, device: str = "cpu", names: Iterable[str] | None = None) -> list[Span]:
    """Spans of the work a torch.profiler run recorded, in ms from its first event (notebook 02).

    device="cpu": the CPU events whose name is in `names` (record_function labels, or op names such as
    "aten::mm"), one lane per thread. device="cuda": every GPU kernel and memory copy, one lane per CUDA stream
    (for GPU work the profiler's `device_resource_id` is the stream).
    """
    from torch.autograd import DeviceType

    wanted = set(names) if names is not None else None
    picked = []
    for e in prof.events():
        if device == "cuda":
            if e.device_type != DeviceType.CUDA:
                continue
            kind = "copy" if "memcpy" in e.name.lower() else "compute"
            lane = f"CUDA stream {e.device_resource_id}"
            label = "copy" if kind == "copy" else _short_kernel_name(e.name)
        else:
            if e.device_type != DeviceType.CPU or (wanted is not None and e.name not in wanted):
                continue
            kind = "copy" if "copy" in e.name.lower() else "compute"
            lane, label = e.thread, e.name
        picked.append((lane, label, e.time_range.start, e.time_range.end, kind))
    if not picked:
        return []
    t0 = min(p[2] for p in picked)
    lanes = {lane: lane if device == "cuda" else f"CPU thread {i}"
             for i, lane in enumerate(dict.fromkeys(p[0] for p in picked))}
    return [Span(lanes[lane], label, (start - t0) / 1e3, (end - t0) / 1e3, kind)  # µs -> ms
            for lane, label, start, end, kind in picked]


def _short_kernel_name(name: str) -> str:
    low = name.lower()
    if any(word in low for word in ("gemm", "matmul", "cutlass", "xmma")):
        return "matmul"
    return name.split("<")[0].split("(")[0][-24:]


def draw_schedules(copy: float, compute: float, n_batches: int, *, unit: str = "ms") -> tuple[float, float]:
    """Draw the model's two schedules one above the other, print their totals; return (serial, overlapped) (notebook 02)."""
    import matplotlib.pyplot as plt

    serial = copy_compute_schedule(n_batches, copy, compute, overlapped=False)
    overlapped = copy_compute_schedule(n_batches, copy, compute, overlapped=True)
    t_serial = max((s.end for s in serial), default=0.0)
    t_overlapped = max((s.end for s in overlapped), default=0.0)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 3.6), sharex=True, layout="constrained")
    lanes = ["copy engine", "compute"]
    draw_timeline(serial, ax=top, lanes=lanes, xmax=t_serial * 1.02 or 1, unit=unit,
                  title="MODEL · one stream: copy, then compute, batch after batch")
    draw_timeline(overlapped, ax=bottom, lanes=lanes, xmax=t_serial * 1.02 or 1, unit=unit,
                  title="MODEL · copies on a side stream, one batch ahead")
    top.set_xlabel("")
    plt.show()
    pace = "the copy" if copy > compute else "the compute" if compute > copy else "both (balanced)"
    saved = 1 - t_overlapped / t_serial if t_serial else 0.0
    print(f"MODEL, {plural(n_batches, 'batch')} of copy {copy:g} {unit} + compute {compute:g} {unit}:\n"
          f"one after the other {t_serial:.2f} {unit}, overlapped {t_overlapped:.2f} {unit} ({saved:.0%} less); "
          f"the slower engine sets the pace: {pace}")
    return t_serial, t_overlapped


# The defaults are the H100 times of record 02/overlap (notebooks/recorded_on_gpu.json, 2026-11-23): a 256 MiB pinned
# copy and an 8192² TF32 matmul, in ms.
def schedule_explorer(copy: float = 4.86, compute: float = 2.69, n_batches: int = 6):
    """Sliders for copy time, compute time and batches that redraw the model's two timelines (notebook 02)."""
    import ipywidgets as widgets

    def show(copy, compute, n_batches):
        draw_schedules(copy, compute, n_batches)

    return widgets.interactive(
        show,
        copy=widgets.FloatSlider(value=copy, min=0.0, max=10.0, step=0.05, description="copy (ms)"),
        compute=widgets.FloatSlider(value=compute, min=0.0, max=10.0, step=0.05, description="compute (ms)"),
        n_batches=widgets.IntSlider(value=n_batches, min=1, max=16, description="batches"),
    )
