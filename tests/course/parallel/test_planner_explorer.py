"""course_lib.parallel.planner's pictures and explorer (lesson 09): the bars add up to the planner's numbers, a layout
that does not fit is drawn and listed as not fitting, and the explorer builds, redraws and falls back to text."""

from __future__ import annotations

import logging
import sys

import pytest

from course_lib.parallel import planner
from course_lib.parallel.planner import (GPUS, H100_GRAND_TETON, LLAMA31_8B, LLAMA31_405B, MEMORY_PARTS,
                                         MODEL_PRESETS, STEP_PARTS, GiB, Layout, ModelShape, best_plans,
                                         draw_memory_breakdown, draw_step_time, memory_per_gpu, plan_explorer,
                                         plan_summary, plan_table, step_parts, step_time)

TINY = ModelShape(n_layers=4, dim=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab_size=256, name="course tiny")
FITS = Layout(dp_shard=8, micro_batch=2, activation_checkpointing="selective")
TOO_BIG = Layout(dp_shard=8, micro_batch=8, activation_checkpointing="none")
NODE = H100_GRAND_TETON  # 8 GPUs of 96 GiB


def _bars(ax) -> dict[str, list[float]]:
    """{part label: heights} of the stacked parts drawn (the outline of a misfit is not a part)."""
    names = {name for _, name, _ in MEMORY_PARTS}
    return {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers if c.get_label() in names}


def _controls(box) -> dict:
    return {c.description: c for row in box.children[:-1] for c in row.children}


def test_the_memory_bars_add_up_to_each_breakdowns_total_and_say_what_does_not_fit():
    fits, too_big = memory_per_gpu(LLAMA31_8B, FITS, 8192), memory_per_gpu(LLAMA31_8B, TOO_BIG, 8192)
    assert fits.total < 0.9 * NODE.memory_bytes < too_big.total
    fig = draw_memory_breakdown({"fits": fits, "too big": too_big}, NODE.memory_bytes, title="8B on 8 GPUs")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "layout" and ax.get_ylabel() == "GiB on the most loaded GPU"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fits", "too big"]
    stacks = list(zip(*_bars(ax).values()))
    for stack, breakdown in zip(stacks, (fits, too_big)):
        assert sum(stack) == pytest.approx(breakdown.total / GiB, rel=1e-12)
    parts = _bars(ax)
    assert parts["parameters"][0] == pytest.approx(fits.params / GiB) and parts["loss (logits)"][1] > 0
    notes = [t.get_text() for t in ax.texts]
    assert notes == [f"{fits.total / GiB:.1f}", f"{too_big.total / GiB:.1f}\ndoes not fit"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"GPU memory (96 GiB)", "usable, 90% (assumed)", "does not fit"} <= set(legend)
    assert sorted(line.get_ydata()[0] for line in ax.lines) == pytest.approx([86.4, 96])
    # without a GPU's memory nothing is judged; a fitting bar alone gets no "does not fit" in the legend
    plain = draw_memory_breakdown({"too big": too_big}).axes[0]
    assert not plain.lines and "does not fit" not in " ".join(t.get_text() for t in plain.texts)
    alone = draw_memory_breakdown({"fits": fits}, NODE.memory_bytes).axes[0]
    assert "does not fit" not in [t.get_text() for t in alone.get_legend().get_texts()]
    for bad in [dict(breakdowns={}), dict(breakdowns={"x": 3.0}), dict(breakdowns={"x": fits}, gpu_memory_bytes=0),
                dict(breakdowns={"x": fits}, headroom=1.5)]:
        with pytest.raises(ValueError):
            draw_memory_breakdown(**bad)


def test_a_steps_parts_add_up_to_the_step_and_are_drawn_end_to_end():
    cluster = NODE.with_nodes(64)
    pipelined = Layout(dp_shard=8, tp=8, pp=8, micro_batch=4, n_microbatches=8, activation_checkpointing="full")
    sharded = Layout(dp_replicate=2, dp_shard=128, cp=2, micro_batch=1, n_microbatches=1,
                     activation_checkpointing="full")
    steps = {"3D": step_time(LLAMA31_405B, pipelined, cluster, 8192),
             "HSDP+CP": step_time(LLAMA31_405B, sharded, cluster, 8192)}
    for step in steps.values():
        parts = step_parts(step)
        assert list(parts) == [key for key, _, _ in STEP_PARTS] and min(parts.values()) >= 0
        assert sum(parts.values()) == pytest.approx(step.step_s, rel=1e-12)
        assert parts["compute"] == step.compute_s and parts["bubble"] == step.step_s * step.bubble
        assert sum(v for k, v in parts.items() if k not in ("compute", "bubble")) == pytest.approx(
            step.exposed_comm_s, rel=1e-12)
    assert step_parts(steps["3D"])["tp"] == steps["3D"].comm_s["tp"] and step_parts(steps["3D"])["bubble"] > 0
    ax = draw_step_time(steps).axes[0]
    assert ax.get_xlabel() == "seconds per step (one GPU)" and ax.get_ylabel() == "layout"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["3D", "HSDP+CP"]
    widths = [[p.get_width() for p in c.patches] for c in ax.containers]
    for i, step in enumerate(steps.values()):
        assert sum(w[i] for w in widths) == pytest.approx(step.step_s, rel=1e-12)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "pipeline bubble (idle)" in legend and "EP all-to-all" not in legend  # dense model: no EP drawn
    with pytest.raises(ValueError):
        draw_step_time({"x": steps["3D"].compute_s})
    with pytest.raises(ValueError):
        step_parts(memory_per_gpu(LLAMA31_8B, FITS, 8192))


def test_best_plans_are_the_fastest_that_fit_or_else_the_least_memory():
    plans, fit = best_plans(LLAMA31_8B, NODE, 16, 8192, top=3)
    assert fit and len(plans) == 3 and all(p.fits for p in plans)
    rates = [p.step.tokens_per_s_per_gpu for p in plans]
    assert rates == sorted(rates, reverse=True)
    assert best_plans(LLAMA31_8B, NODE, 16, 8192, top=2)[0] == plans[:2]  # remembered, then cut
    assert best_plans(LLAMA31_8B, NODE, 16, 8192, checkpointing="full", top=3)[0][0].layout \
        .activation_checkpointing == "full"
    misfits, fit = best_plans(LLAMA31_405B, NODE, 16, 8192, top=4)
    assert not fit and not any(p.fits for p in misfits)
    totals = [p.memory.total for p in misfits]
    assert totals == sorted(totals) and totals[0] > 0.9 * NODE.memory_bytes
    table = plan_table(misfits)
    rows = [line for line in table.splitlines() if line.startswith("#") and not line.startswith("# ")]
    assert len(rows) == 4 and all(" no " in row for row in rows)
    assert " ep " not in table.splitlines()[0]  # dense: no EP column
    summary = plan_summary(misfits, NODE, fit=False)
    assert summary[0].startswith("Nothing fits: these are the 4 layouts that need the least memory.")
    assert any("is over the 90% of 96 GiB" in line for line in summary)
    assert all(len(line) <= 100 for line in table.splitlines() + summary)
    with pytest.raises(ValueError):
        best_plans(LLAMA31_8B, NODE, 16, 8192, checkpointing="some")


def test_the_explorer_builds_redraws_and_shows_what_does_not_fit(caplog, capsys):
    import ipywidgets as widgets

    with caplog.at_level(logging.WARNING):
        box = plan_explorer(TINY, global_batch=8, seq_len=1024)
        assert isinstance(box, widgets.VBox) and isinstance(box.children[-1], widgets.Output)
        c = _controls(box)
        assert c["model"].value == "course tiny" and list(c["model"].options)[1:] == list(MODEL_PRESETS)
        assert box.plans and all(p.fits for p in box.plans) and len(box.plans) == c["layouts shown"].value
        assert box.cluster.n_gpus == 8 and box.cluster.memory_bytes == NODE.memory_bytes
        c["layouts shown"].value = 2
        assert len(box.plans) == 2
        c["model"].value = "Llama 3.1 405B"
        assert box.plans and not any(p.fits for p in box.plans)
        c["GPU"].value = "A100 80GB (network assumed)"  # the memory follows the GPU
        assert c["GPU memory (GiB)"].value == 80 and box.cluster.memory_bytes == 80 * GiB
        assert box.cluster.peak_flops == GPUS["A100 80GB (network assumed)"].peak_flops
        c["GPUs per node"].value, c["global batch (sequences)"].value = 4, 1
        assert box.cluster.n_gpus == 4 and box.plans
        c["checkpointing"].value = "none"
        assert all(p.layout.activation_checkpointing == "none" for p in box.plans)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "a callback raised"
    out = capsys.readouterr().out
    assert "fastest layouts that fit, fastest first:" in out and "no layout fits; the least memory first:" in out
    assert "Nothing fits: these are the 2 layouts that need the least memory." in out
    assert all(len(line) <= 100 for line in out.splitlines())
    for bad in [dict(model="Llama 2"), dict(cluster="H200"), dict(model=3), dict(checkpointing="some"),
                dict(global_batch=0)]:
        with pytest.raises((ValueError, TypeError)):
            plan_explorer(**bad)


def test_without_ipywidgets_the_explorer_prints_its_plan(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import ipywidgets raises ImportError
    assert plan_explorer("Llama 3.1 8B", global_batch=16, shown=2) is None
    out = capsys.readouterr().out
    assert "ipywidgets is not installed" in out and "#2" in out and "#3" not in out
    assert "Figure" not in out and all(len(line) <= 100 for line in out.splitlines())


def test_the_planner_package_names_the_explorer():
    for name in ("plan_explorer", "best_plans", "plan_table", "plan_summary", "GPUS", "MODEL_PRESETS",
                 "draw_memory_breakdown",
                 "draw_step_time", "step_parts", "MEMORY_PARTS", "STEP_PARTS"):
        assert name in planner.__all__ and hasattr(planner, name)
