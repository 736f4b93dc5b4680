"""The planner's explorer: pick a model, a cluster, a batch and checkpointing, and see the layouts that fit ranked,
their memory per GPU and their step (lesson 09, `notebooks/09_putting_it_together.ipynb`).

    GPUS, MODEL_PRESETS                   the menus' presets: the planner's clusters (peak FLOP/s, links, memory)
                                          and Llama 3.1 8B, 70B and 405B
    best_plans(shape, cluster, batch, seq_len)   the fastest layouts that fit or, when none does, those that need
                                          the least memory (remembered: changing only what is shown is instant)
    plan_table(plans) / plan_summary(plans, cluster)   the ranked table and what #1's numbers mean, as text
    plan_explorer(model=None, ...)        menus and sliders that redraw the table, pictures.py's two pictures and
                                          the summary; without ipywidgets it prints the table for its settings

The planner itself is layouts.py's rank_layouts; this module only chooses what to show and draws it.
"""

from __future__ import annotations

import functools
import textwrap
from typing import Sequence

from course_lib.parallel import whole_number
from course_lib.parallel.planner.inputs import (A100_80GB_CLUSTER, CHECKPOINTING, H100_GRAND_TETON, LLAMA31_8B,
                                                LLAMA31_70B, LLAMA31_405B, Cluster, ModelShape)
from course_lib.parallel.planner.layouts import ASSUMED_HEADROOM, PLAN_HEADER, Plan, plan_rows, rank_layouts
from course_lib.parallel.planner.memory import GiB
from course_lib.parallel.planner.pictures import draw_memory_breakdown, draw_step_time
from course_lib.parallel.planner.step_time import ASSUMED_MFU
from course_lib.tables import format_table, plural

__all__ = ["GPUS", "MODEL_PRESETS", "best_plans", "plan_table", "plan_summary", "plan_explorer"]

# The planner's clusters, one per GPU: its peak FLOP/s (torchtitan's get_peak_flops), links and memory. No H200:
# its figures were found only at second hand (torchtitan's get_peak_flops quotes NVIDIA's page for 989e12); pass
# your own Cluster to plan_explorer to plan for another GPU.
GPUS: dict[str, Cluster] = {c.name: c for c in (H100_GRAND_TETON, A100_80GB_CLUSTER)}
MODEL_PRESETS: dict[str, ModelShape] = {s.name: s for s in (LLAMA31_8B, LLAMA31_70B, LLAMA31_405B)}

_CHECKPOINTING = [("any: the planner picks", "any"), ("none", "none"), ("selective (per-op SAC)", "selective"),
                  ("full (every layer)", "full")]
_NODES = [1, 2, 4, 8, 16, 32, 64]
_PER_NODE = [1, 2, 4, 8]
_MEMORY_GIB = [16, 24, 32, 40, 48, 64, 80, 96, 128, 192]
_BATCHES = [2**i for i in range(13)]
_SEQ_LENS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
_COLUMNS = {"dp_rep": "rep", "dp_shard": "shard", "tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep",
            "micro×m": "micro×m", "AC": "AC", "schedule": "schedule", "GiB/GPU": "GiB", "fits": "fits",
            "tok/s/GPU": "tok/s/GPU", "MFU %": "MFU %"}


@functools.lru_cache(maxsize=32)
def _ranked(shape: ModelShape, cluster: Cluster, global_batch: int, seq_len: int, checkpointing: tuple[str, ...],
            top: int, mfu: float, headroom: float) -> tuple[tuple[Plan, ...], bool]:
    plans = rank_layouts(shape, cluster, global_batch, seq_len, mfu=mfu, headroom=headroom, include_misfits=True,
                         checkpointing=checkpointing)
    fitting = [p for p in plans if p.fits]
    if fitting:
        return tuple(fitting[:top]), True
    return tuple(sorted(plans, key=lambda p: p.memory.total)[:top]), False


def best_plans(shape: ModelShape, cluster: Cluster, global_batch: int, seq_len: int, *, checkpointing: str = "any",
               top: int = 8, mfu: float = ASSUMED_MFU, headroom: float = ASSUMED_HEADROOM) -> tuple[list[Plan], bool]:
    """(plans, fit): the `top` fastest layouts that fit (fit True) or, when none does, the `top` that need the least
    memory (fit False), from rank_layouts with checkpointing "any" (every choice) or one of CHECKPOINTING. The last
    32 answers are remembered, so a redraw that changes only what is shown costs nothing (lesson 09)."""
    if checkpointing != "any" and checkpointing not in CHECKPOINTING:
        raise ValueError(f"checkpointing must be 'any' or one of {CHECKPOINTING}, not {checkpointing!r}")
    choices = CHECKPOINTING if checkpointing == "any" else (checkpointing,)
    top = whole_number(top, "top")
    plans, fit = _ranked(shape, cluster, whole_number(global_batch, "global_batch"), whole_number(seq_len, "seq_len"),
                         choices, max(top, 8), float(mfu), float(headroom))
    return list(plans[:top]), fit


def plan_table(plans: Sequence[Plan]) -> str:
    """The plans numbered #1, #2... under a narrower PLAN_HEADER (ep only for MoE layouts), with a key (lesson 09)."""
    keep = [c for c in _COLUMNS if c != "ep" or any(p.layout.ep > 1 for p in plans)]
    where = [PLAN_HEADER.index(c) for c in keep]
    rows = [[f"#{i}"] + [row[j] for j in where] for i, row in enumerate(plan_rows(plans), 1)]
    key = ("rep × shard: data parallel (HSDP replicas × FSDP shards); micro×m: sequences per micro-batch × "
           "micro-batches per step; AC: activation checkpointing; GiB: the most loaded GPU's peak")
    return format_table(["#"] + [_COLUMNS[c] for c in keep], rows) + "\n" + textwrap.fill(key, 100)


def plan_summary(plans: Sequence[Plan], cluster: Cluster, *, fit: bool = True, mfu: float = ASSUMED_MFU,
                 headroom: float = ASSUMED_HEADROOM) -> list[str]:
    """What #1's numbers mean, in lines under 100 characters (lesson 09)."""
    if not plans:
        return []
    best, memory = plans[0], cluster.memory_bytes / GiB
    step = best.step
    where = "fits in" if best.fits else "is over"
    lines = [f"#1 needs {best.memory.total / GiB:.1f} GiB on its most loaded GPU ({best.memory.stage} stage): it "
             f"{where} the {headroom:.0%} of {memory:.0f} GiB the planner lets a layout use.",
             f"Its step: {step.step_s:.3g} s = compute {step.compute_s:.3g} s (×{step.recompute_factor:.2f} for "
             f"recomputation) + exposed communication {step.exposed_comm_s:.3g} s, then {step.bubble:.1%} bubble.",
             f"That is {step.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {step.mfu_predicted:.1%}: compute "
             f"runs at an assumed {mfu:.0%} of the {cluster.peak_flops / 1e12:.0f} TFLOP/s peak."]
    if not fit:
        lines.insert(0, f"Nothing fits: these are the {plural(len(plans), 'layout')} that need the least memory. "
                        "Try more GPUs, more GPU memory, full checkpointing or shorter sequences.")
    return [wrapped for line in lines for wrapped in textwrap.wrap(line, 100, subsequent_indent="  ")]


def _cluster(base: Cluster, gpus_per_node: int, nodes: int, memory_gib: float) -> Cluster:
    """base's GPU (peak, links) with these counts and memory; its intra-node link stays the full node's."""
    return Cluster(base.name, gpus_per_node, nodes, memory_gib * GiB, base.intra_node, base.inter_node,
                   base.peak_flops, base.peak_source)


def _show(shape: ModelShape, cluster: Cluster, global_batch: int, seq_len: int, checkpointing: str, top: int,
          *, draw: bool = True) -> list[Plan]:
    """Print the heading and table, display the pictures (draw=True), print the summary; the plans shown."""
    print(textwrap.fill(f"{shape.name} on {plural(cluster.n_gpus, 'GPU')} ({plural(cluster.nodes, 'node')} of "
                        f"{cluster.gpus_per_node}, {cluster.name}), global batch {plural(global_batch, 'sequence')} "
                        f"of {seq_len:,} tokens", 100))
    try:
        plans, fit = best_plans(shape, cluster, global_batch, seq_len, checkpointing=checkpointing, top=top)
    except ValueError as error:
        print(textwrap.fill(f"not planned: {error}", 100, subsequent_indent="  "))
        return []
    if not plans:
        print(textwrap.fill(f"No valid layout: {plural(cluster.n_gpus, 'GPU')} cannot share a global batch of "
                            f"{plural(global_batch, 'sequence')} this way (each data-parallel rank needs whole "
                            "sequences). Try a larger batch or fewer GPUs.", 100))
        return []
    print(("fastest layouts that fit, fastest first:" if fit else "no layout fits; the least memory first:"))
    print(plan_table(plans))
    if draw:
        from IPython.display import display

        display(_figure(shape, cluster, plans))
    for line in plan_summary(plans, cluster, fit=fit):
        print(line)
    return plans


def _figure(shape: ModelShape, cluster: Cluster, plans: Sequence[Plan]):
    """One picture: the plans' memory (left) and their steps (right), labelled #1, #2... as the table."""
    from course_lib.diagrams import Picture

    fig = Picture(figsize=(12, 1.9 + max(2.6, 0.42 * len(plans))), layout="constrained")
    memory_ax, step_ax = fig.subplots(1, 2, width_ratios=[1.15, 1.4])
    labels = [f"#{i}" for i in range(1, len(plans) + 1)]
    draw_memory_breakdown(dict(zip(labels, (p.memory for p in plans))), cluster.memory_bytes, ax=memory_ax)
    draw_step_time(dict(zip(labels, (p.step for p in plans))), ax=step_ax)
    fig.suptitle(f"{shape.name} on {plural(cluster.n_gpus, 'GPU')} ({cluster.name})", fontsize=11)
    return fig


def _start(name: str | None, menu: dict, what: str) -> str:
    name = next(iter(menu)) if name is None else name
    if name not in menu:
        raise ValueError(f"unknown {what} {name!r}: use one of {', '.join(map(repr, menu))}")
    return name


def _slider(label: str, choices: Sequence, value, fmt=str):
    import ipywidgets as widgets

    options = [(fmt(c), c) for c in sorted(set(choices) | {value})]
    return widgets.SelectionSlider(options=options, value=value, description=label, continuous_update=False,
                                   style={"description_width": "initial"})


def _menu(given, presets: dict, kind: type, what: str) -> tuple[dict, str]:
    """The menu (the given one first when it is a `kind`) and the name to start at."""
    if isinstance(given, kind):
        return {given.name: given, **{k: v for k, v in presets.items() if k != given.name}}, given.name
    if given is not None and not isinstance(given, str):
        raise ValueError(f"{what} must be a {kind.__name__}, the name of a preset or None, not "
                         f"{type(given).__name__}")
    return dict(presets), _start(given, presets, what)


def plan_explorer(model: ModelShape | str | None = None, cluster: Cluster | str | None = None, *,
                  gpus_per_node: int | None = None, nodes: int | None = None, memory_gib: float | None = None,
                  global_batch: int = 16, seq_len: int = 8192, checkpointing: str = "any", shown: int = 5):
    """Menus and sliders (model, GPU, GPUs per node, nodes, GPU memory, global batch, sequence length, activation
    checkpointing, layouts shown) that redraw the fastest layouts that fit, their memory and their step (lesson 09).

    model: a ModelShape (the course's small model: ModelShape.of(config)), added to the menu of Llama 3.1 8B, 70B
    and 405B and shown first, or a preset's name. cluster: a Cluster (its GPU, links and peak; its counts and memory
    start the sliders), added to GPUS, or a GPU's name; gpus_per_node, nodes and memory_gib start elsewhere (fewer
    GPUs per node keep the full node's NVLink figures: an approximation).
    Returns the ipywidgets VBox; its .plans are the plans last shown ([] when none could be), .cluster the cluster.
    Without ipywidgets: prints the table and summary for these settings and returns None.
    """
    models, model_name = _menu(model, MODEL_PRESETS, ModelShape, "model")
    clusters, gpu_name = _menu(cluster, GPUS, Cluster, "cluster")
    base = clusters[gpu_name]
    per_node = whole_number(gpus_per_node if gpus_per_node is not None else base.gpus_per_node, "gpus_per_node")
    n_nodes = whole_number(nodes if nodes is not None else base.nodes, "nodes")
    memory = float(memory_gib) if memory_gib is not None else base.memory_bytes / GiB
    _start(checkpointing, {value: label for label, value in _CHECKPOINTING}, "checkpointing")
    start = (whole_number(global_batch, "global_batch"), whole_number(seq_len, "seq_len"))
    try:
        import ipywidgets as widgets
    except ImportError:
        print("(ipywidgets is not installed: the plan for these settings, not drawn)")
        _show(models[model_name], _cluster(base, per_node, n_nodes, memory), *start, checkpointing,
              whole_number(shown, "shown"), draw=False)
        return None
    wide = {"description_width": "initial"}
    controls = {
        "model": widgets.Dropdown(options=list(models), value=model_name, description="model", style=wide),
        "gpu": widgets.Dropdown(options=list(clusters), value=gpu_name, description="GPU", style=wide,
                                layout=widgets.Layout(width="380px")),
        "per_node": _slider("GPUs per node", _PER_NODE, per_node),
        "nodes": _slider("nodes", _NODES, n_nodes),
        "memory": _slider("GPU memory (GiB)", _MEMORY_GIB, memory, lambda g: f"{g:g}"),
        "batch": _slider("global batch (sequences)", _BATCHES, start[0]),
        "seq": _slider("sequence length", _SEQ_LENS, start[1], lambda s: f"{s:,}"),
        "ac": widgets.Dropdown(options=_CHECKPOINTING, value=checkpointing, description="checkpointing", style=wide),
        "shown": widgets.IntSlider(value=whole_number(shown, "shown"), min=1, max=8, description="layouts shown",
                                   continuous_update=False, style=wide),
    }
    return _explorer_box(widgets, controls, models, clusters)


def _explorer_box(widgets, c: dict, models: dict, clusters: dict):
    """The VBox of the controls and their output, redrawn on every change (a new GPU also resets the memory)."""
    out = widgets.Output()
    box = widgets.VBox([widgets.HBox([c["model"], c["gpu"]]), widgets.HBox([c["per_node"], c["nodes"], c["memory"]]),
                        widgets.HBox([c["batch"], c["seq"]]), widgets.HBox([c["ac"], c["shown"]]), out])
    box.plans, syncing = [], [False]

    def redraw(change=None):
        if syncing[0]:
            return
        box.cluster = _cluster(clusters[c["gpu"].value], c["per_node"].value, c["nodes"].value, c["memory"].value)
        with out:
            out.clear_output(wait=True)
            box.plans = _show(models[c["model"].value], box.cluster, c["batch"].value, c["seq"].value,
                              c["ac"].value, c["shown"].value)

    def new_gpu(change):
        gib = clusters[change["new"]].memory_bytes / GiB
        syncing[0] = True
        try:
            c["memory"].options = [(f"{g:g}", g) for g in sorted(set(_MEMORY_GIB) | {gib, c["memory"].value})]
            c["memory"].value = gib
        finally:
            syncing[0] = False
        redraw()

    for name, control in c.items():
        control.observe(new_gpu if name == "gpu" else redraw, names="value")
    redraw()
    return box
