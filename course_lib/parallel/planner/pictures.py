"""The planner's predictions drawn: memory per GPU as stacked bars, a step as its parts (lesson 09,
`notebooks/09_putting_it_together.ipynb`).

    draw_memory_breakdown(breakdowns, gpu_memory_bytes)   a stacked bar per layout (params, grads, optimizer,
                                                          activations, FSDP buffers, loss), the GPU's memory a line
    step_parts(step)                                      a StepTime's seconds by part: compute, each kind of
                                                          exposed communication, the bubble; they add up to step_s
    draw_step_time(steps)                                 a horizontal stacked bar per layout of step_parts

Both return a matplotlib Figure that a notebook shows as a picture (course_lib.diagrams.Picture, nothing left in
pyplot's state), or draw into `ax` when given one. The numbers are memory.py's and step_time.py's; matplotlib is
imported only when something is drawn. Colours: the Okabe–Ito palette, as the course's other pictures.
"""

from __future__ import annotations

from typing import Mapping

from course_lib.parallel.planner.layouts import ASSUMED_HEADROOM
from course_lib.parallel.planner.memory import GiB, MemoryBreakdown
from course_lib.parallel.planner.step_time import OVERLAPPED, StepTime

__all__ = ["MEMORY_PARTS", "STEP_PARTS", "draw_memory_breakdown", "step_parts", "draw_step_time"]

# MemoryBreakdown's terms, bottom to top: (field, label, colour)
MEMORY_PARTS = (("params", "parameters", "#0072B2"), ("grads", "gradients", "#56B4E9"),
                ("optimizer", "optimizer state", "#009E73"), ("activations", "activations", "#E69F00"),
                ("fsdp_buffers", "FSDP buffers (gathered)", "#CC79A7"), ("loss", "loss (logits)", "#D55E00"))

# step_parts' keys, left to right: (key, label, colour); the bubble is drawn hatched, as notebook 07's idle time
STEP_PARTS = (("compute", "compute (recompute included)", "#0072B2"), ("tp", "TP collectives", "#E69F00"),
              ("cp", "CP ring, exposed", "#009E73"), ("ep", "EP all-to-all", "#F0E442"),
              ("pp", "PP sends", "#D55E00"), ("fsdp", "FSDP gather/scatter, exposed", "#CC79A7"),
              ("hsdp", "HSDP all-reduce, exposed", "#56B4E9"), ("bubble", "pipeline bubble (idle)", "#F4F4F4"))
_NOT_FIT = "#D55E00"


def _axes(ax, figsize: tuple[float, float]):
    """The axes to draw in: `ax`, or those of a new course picture."""
    if ax is not None:
        return ax
    from course_lib.diagrams import Picture

    return Picture(figsize=figsize, layout="constrained").subplots()


def draw_memory_breakdown(breakdowns: Mapping[str, MemoryBreakdown], gpu_memory_bytes: float | None = None, *,
                          headroom: float = ASSUMED_HEADROOM, title: str = "", ax=None):
    """A stacked bar of GiB per GPU for each {label: MemoryBreakdown}, its total above it (lesson 09).

    With gpu_memory_bytes, the GPU's memory is a solid line and headroom × it (what the planner lets a layout use,
    ASSUMED_HEADROOM) a dashed one; a bar above the dashed line is outlined in vermillion and marked "does not fit", as
    rank_layouts would judge it. Returns the Figure.
    """
    from matplotlib.patches import Patch

    if not breakdowns or not all(isinstance(b, MemoryBreakdown) for b in breakdowns.values()):
        raise ValueError("breakdowns must map at least one label to a MemoryBreakdown (memory_per_gpu's result)")
    if gpu_memory_bytes is not None and not gpu_memory_bytes > 0:
        raise ValueError(f"gpu_memory_bytes must be > 0 or None, not {gpu_memory_bytes!r}")
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be a fraction of the GPU's memory in (0, 1], not {headroom!r}")
    ax = _axes(ax, (1.8 + 1.1 * len(breakdowns), 4.2))
    labels = list(breakdowns)
    x = range(len(labels))
    bottoms = [0.0] * len(labels)
    for field, name, colour in MEMORY_PARTS:
        heights = [getattr(breakdowns[k], field) / GiB for k in labels]
        if not any(heights):
            continue  # a term no layout here has (no FSDP, no loss on this stage) stays out of the legend
        ax.bar(x, heights, bottom=bottoms, color=colour, edgecolor="white", linewidth=0.5, label=name, width=0.7)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    usable = None if gpu_memory_bytes is None else headroom * gpu_memory_bytes / GiB
    misfits = [usable is not None and breakdowns[k].total > headroom * gpu_memory_bytes for k in labels]
    for i, (total, misfit) in enumerate(zip(bottoms, misfits)):
        if misfit:
            ax.bar([i], [total], fill=False, edgecolor=_NOT_FIT, linewidth=2.5, width=0.7, zorder=3,
                   label="_does not fit")
        ax.annotate(f"{total:.1f}" + ("\ndoes not fit" if misfit else ""), (i, total), ha="center", va="bottom",
                    fontsize=7 if misfit else 8, color=_NOT_FIT if misfit else "black", xytext=(0, 2),
                    textcoords="offset points")
    handles, names = ax.get_legend_handles_labels()
    handles, names = handles[::-1], names[::-1]  # top of the stack first
    top = max(bottoms)
    if usable is not None:
        memory = gpu_memory_bytes / GiB
        handles += [ax.axhline(memory, color="black", linewidth=1.2),
                    ax.axhline(usable, color="black", linewidth=1, linestyle="--")]
        names += [f"GPU memory ({memory:.0f} GiB)", f"usable, {headroom:.0%} (assumed)"]
        top = max(top, memory)
        if any(misfits):
            handles.append(Patch(fill=False, edgecolor=_NOT_FIT, linewidth=2.5))
            names.append("does not fit")
    ax.set_ylim(0, 1.18 * top)
    ax.set_xticks(list(x), labels)
    ax.set_xlabel("layout")
    ax.set_ylabel("GiB on the most loaded GPU")
    ax.set_title(title or "memory per GPU (peak, allocated)", fontsize=10, loc="left")
    ax.legend(handles, names, fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return ax.figure


def step_parts(step: StepTime) -> dict[str, float]:
    """Seconds of one step by part, keys as STEP_PARTS: compute; the exposed communication of each kind; the bubble.

    TP's, EP's and PP's collectives are on the critical path and show whole. Of the OVERLAPPED kinds (FSDP, HSDP,
    CP) step_time knows only the total that shows (what exceeds the compute, at least one FSDP unit's share); here
    it is split between them in proportion to their time before overlap, a choice made for the picture. The bubble
    is step_s × bubble, so the parts add up to step_s."""
    if not isinstance(step, StepTime):
        raise ValueError(f"step must be a StepTime (step_time's result), not {type(step).__name__}")
    hidden = sum(step.comm_s.get(k, 0.0) for k in OVERLAPPED)
    critical = sum(v for k, v in step.comm_s.items() if k not in OVERLAPPED)
    shown = max(0.0, step.exposed_comm_s - critical)
    parts = {"compute": step.compute_s}
    for key, _, _ in STEP_PARTS[1:-1]:
        seconds = step.comm_s.get(key, 0.0)
        parts[key] = (shown * seconds / hidden if hidden else 0.0) if key in OVERLAPPED else seconds
    parts["bubble"] = step.step_s * step.bubble
    return parts


def draw_step_time(steps: Mapping[str, StepTime], *, title: str = "", ax=None):
    """A horizontal stacked bar of step_parts for each {label: StepTime}, the first on top, tokens/s per GPU at its
    end (lesson 09). Returns the Figure."""
    if not steps or not all(isinstance(s, StepTime) for s in steps.values()):
        raise ValueError("steps must map at least one label to a StepTime (step_time's result)")
    ax = _axes(ax, (8.5, 1.4 + 0.5 * len(steps)))
    labels = list(steps)
    parts = {k: step_parts(steps[k]) for k in labels}
    lefts = [0.0] * len(labels)
    for key, name, colour in STEP_PARTS:
        widths = [parts[k][key] for k in labels]
        if not any(widths):
            continue  # a kind no layout here uses stays out of the legend
        bubble = key == "bubble"
        ax.barh(range(len(labels)), widths, left=lefts, color=colour, label=name, height=0.6,
                edgecolor="#999999" if bubble else "white", linewidth=0.5, hatch="///" if bubble else None)
        lefts = [a + w for a, w in zip(lefts, widths)]
    for i, label in enumerate(labels):
        ax.annotate(f"{steps[label].tokens_per_s_per_gpu:,.0f} tok/s/GPU", (lefts[i], i), va="center", fontsize=8,
                    xytext=(3, 0), textcoords="offset points")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlim(0, 1.3 * max(lefts))
    ax.set_xlabel("seconds per step (one GPU)")
    ax.set_ylabel("layout")
    ax.set_title(title or "one step: compute, exposed communication, bubble", fontsize=10, loc="left")
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="x", alpha=0.3)
    return ax.figure
