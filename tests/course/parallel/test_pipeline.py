"""course_lib.parallel.pipeline: notebook 07's schedules, formulas, pictures and split models.

References: the dependencies of a pipeline written out again here, the published formulas by hand, torch's own
op order for the schedules it computes ahead of time (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble), and
the unsplit model's outputs and gradients.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import matplotlib.pyplot
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.figure import Figure
from torch import nn

from course_lib.parallel.pipeline import (KINDS, NaiveSplit, Op, as_fraction_of_total, as_ratio_to_ideal, bubble,
                                          draw_schedule, gpipe_bubble, interleaved_bubble, makespan, naive_split,
                                          peak_in_flight, schedule_explorer, simulate, split_by_boundaries,
                                          stage_costs, stage_times, timeline_of_naive_split)
from course_lib.parallel.pipeline.schedules import _device_orders

matplotlib.use("Agg")
FAST = settings(max_examples=150, deadline=None)
TIMES = st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 3.0])


@st.composite
def schedules(draw, kinds=tuple(KINDS), comm=True):
    """(kind, p, m, keyword arguments) of a schedule simulate() must accept."""
    kind = draw(st.sampled_from(kinds))
    p = draw(st.integers(1, 5))
    kw = dict(forward_time=draw(TIMES), backward_time=draw(TIMES),
              comm_time=draw(st.sampled_from([0.0, 0.1, 0.5, 1.5])) if comm else 0.0)
    if kind == "interleaved-1f1b":
        m = p * draw(st.integers(1, 3))
        kw["chunks"] = draw(st.integers(1, 3))
    else:
        m = draw(st.integers(1, 10))
    return kind, p, m, kw


# ------------------------------------------------------------------------------------------------ dependencies


@FAST
@given(schedules())
def test_every_schedule_runs_each_op_once_in_dependency_order_and_as_early_as_it_can(case):
    kind, p, m, kw = case
    ops = simulate(kind, p, m, **kw)
    v = kw.get("chunks", 1)
    f, b, c = kw["forward_time"], kw["backward_time"], kw["comm_time"]
    kinds = "FBW" if kind == "zero-bubble" else "FB"
    by_key = {(op.stage, op.micro_batch, op.kind): op for op in ops}
    assert len(by_key) == len(ops) == len(kinds) * p * v * m, "each (stage, micro-batch, kind) exactly once"
    assert set(by_key) == {(s, i, k) for s in range(p * v) for i in range(m) for k in kinds}
    assert ops == sorted(ops, key=lambda op: (op.start, op.device))
    duration = {"F": f / v, "B": (b / 2) if kind == "zero-bubble" else b / v, "W": b / 2}
    last = p * v - 1

    def arrival(op):
        """When op's input is on its device (the reference: a pipeline's dependencies, written out again)."""
        if op.kind == "F":
            before = by_key.get((op.stage - 1, op.micro_batch, "F"))
        elif op.kind == "B":
            before = by_key[(op.stage, op.micro_batch, "F")] if op.stage == last else \
                by_key[(op.stage + 1, op.micro_batch, "B")]
        else:
            before = by_key[(op.stage, op.micro_batch, "B")]
        if before is None:
            return 0.0
        return before.end + (c if before.device != op.device else 0.0)

    for op in ops:
        assert op.device == op.stage % p and op.chunk == op.stage // p
        assert op.duration == pytest.approx(duration[op.kind])
        assert op.start >= arrival(op) - 1e-9, f"{op} starts before its input arrives"
    for device in range(p):
        mine = [op for op in ops if op.device == device]
        previous_end = 0.0
        for op in mine:  # one op at a time, each as soon as the device is free and its input is there
            assert op.start >= previous_end - 1e-9, f"device {device} runs two ops at once: {op}"
            assert op.start == pytest.approx(max(previous_end, arrival(op)), abs=1e-9), f"{op} waits for nothing"
            previous_end = op.end
        order = [(op.stage, op.micro_batch, op.kind) for op in mine]
        assert order == _device_orders(kind, p, m, v)[device]
    assert min(op.start for op in ops) == 0.0


def _torch_orders(schedule_class, p, m, v):
    """The per-rank op order torch computes ahead of time (private API: skip where it moved)."""
    names = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "B", "BACKWARD_WEIGHT": "W"}
    schedule = object.__new__(schedule_class)
    schedule.pp_group_size, schedule.n_local_stages, schedule._n_microbatches = p, v, m
    schedule.number_of_rounds = max(1, m // p)
    schedule.microbatches_per_round = m // schedule.number_of_rounds
    try:
        return [[(a.stage_index, a.microbatch_index, names[a.computation_type.name])
                 for a in schedule._calculate_single_rank_operations(rank) if a is not None] for rank in range(p)]
    except (AttributeError, TypeError, KeyError) as error:  # pragma: no cover - another torch's internals
        pytest.skip(f"torch {torch.__version__} computes its schedules differently: {error!r}")


def test_interleaved_and_zero_bubble_run_torch_s_own_op_order():
    from torch.distributed.pipelining import ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble

    for p in range(1, 6):
        for m in range(1, 10):
            assert _device_orders("zero-bubble", p, m, 1) == _torch_orders(ScheduleInterleavedZeroBubble, p, m, 1)
        for rounds in range(1, 4):
            for v in range(1, 4):
                assert _device_orders("interleaved-1f1b", p, p * rounds, v) == \
                    _torch_orders(ScheduleInterleaved1F1B, p, p * rounds, v)


def test_gpipe_and_1f1b_orders_by_hand():
    assert _device_orders("gpipe", 2, 3, 1)[1] == [(1, 0, "F"), (1, 1, "F"), (1, 2, "F"),
                                                  (1, 0, "B"), (1, 1, "B"), (1, 2, "B")]
    # torch's Schedule1F1B: min(m, p − s) forwards, then B, F alternately, then the remaining B
    first, last = _device_orders("1f1b", 3, 5, 1)[0], _device_orders("1f1b", 3, 5, 1)[2]
    assert "".join(k for _, _, k in first) == "FFFBFBFBBB"
    assert "".join(k for _, _, k in last) == "FBFBFBFBFB"
    assert [i for _, i, k in first if k == "F"] == [0, 1, 2, 3, 4] == [i for _, i, k in first if k == "B"]


# ------------------------------------------------------------------------------------------------ bubbles


def test_gpipe_and_1f1b_bubble_with_unit_times_is_the_gpipe_formula():
    for kind in ("gpipe", "1f1b"):
        for p in range(1, 9):
            for m in range(1, 17):
                ops = simulate(kind, p, m, forward_time=1.0, backward_time=1.0)
                assert bubble(ops) == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
                assert makespan(ops) == 2 * (m + p - 1)


@FAST
@given(schedules(kinds=("gpipe", "1f1b"), comm=False))
def test_the_gpipe_formula_holds_exactly_for_any_forward_and_backward_times(case):
    kind, p, m, kw = case
    ops = simulate(kind, p, m, **kw)
    assert bubble(ops) == pytest.approx(gpipe_bubble(p, m), abs=1e-12)
    assert makespan(ops) == pytest.approx((m + p - 1) * (kw["forward_time"] + kw["backward_time"]))


@FAST
@given(schedules(kinds=("gpipe", "1f1b"), comm=True))
def test_communication_adds_two_trips_per_hop_to_gpipe_and_at_least_that_to_1f1b(case):
    kind, p, m, kw = case
    span = makespan(simulate(kind, p, m, **kw))
    gpipe = (m + p - 1) * (kw["forward_time"] + kw["backward_time"]) + 2 * (p - 1) * kw["comm_time"]
    if kind == "gpipe":
        assert span == pytest.approx(gpipe)
    else:  # 1F1B's strict F/B alternation puts each round trip on the critical path in the steady state too
        assert span >= gpipe - 1e-9


def test_peak_in_flight_gpipe_holds_every_micro_batch_1f1b_at_most_p():
    for p in range(1, 9):
        for m in range(1, 17):
            assert peak_in_flight(simulate("gpipe", p, m)) == {s: m for s in range(p)}
            held = peak_in_flight(simulate("1f1b", p, m))
            assert held == {s: min(m, p - s) for s in range(p)}
            assert max(held.values()) <= p


@FAST
@given(schedules(kinds=("interleaved-1f1b",), comm=False))
def test_interleaved_bubble_is_narayanan_s_formula_exactly(case):
    _, p, m, kw = case
    v = kw["chunks"]
    ops = simulate("interleaved-1f1b", p, m, **kw)
    ideal = m * (kw["forward_time"] + kw["backward_time"])  # each device's own work
    assert (makespan(ops) - ideal) / ideal == pytest.approx(interleaved_bubble(p, m, v), abs=1e-12)
    assert bubble(ops) == pytest.approx(as_fraction_of_total(interleaved_bubble(p, m, v)), abs=1e-12)


def test_interleaving_shrinks_the_bubble_and_costs_activations():
    for p in range(2, 7):
        for m in (p, 2 * p, 3 * p):
            one = simulate("1f1b", p, m)
            for v in (2, 3, 4):
                ops = simulate("interleaved-1f1b", p, m, chunks=v)
                assert bubble(ops) < bubble(one)
                chunks_held = peak_in_flight(ops)
                assert chunks_held[0] / v > peak_in_flight(one)[0] - 1  # about p micro-batches, a little more
    assert interleaved_bubble(4, 8, 1) == pytest.approx(as_ratio_to_ideal(gpipe_bubble(4, 8)))


@FAST
@given(schedules(kinds=("zero-bubble",), comm=False))
def test_zero_bubble_idles_less_than_1f1b_within_1f1b_s_memory(case):
    _, p, m, kw = case
    f, b = kw["forward_time"], kw["backward_time"]
    ops = simulate("zero-bubble", p, m, **kw)
    one = simulate("1f1b", p, m, forward_time=f, backward_time=b)
    if p > 1:
        assert bubble(ops) < bubble(one)
    assert max(peak_in_flight(ops).values()) <= p
    if m >= p:  # each device idles (p − 1)·max(T_F, T_B), with T_B = T_W = backward_time / 2
        assert makespan(ops) - m * (f + b) == pytest.approx((p - 1) * max(f, b / 2), abs=1e-9)


def test_zero_bubble_with_equal_f_b_w_is_a_third_of_1f1b_s_bubble():
    """Qi et al.'s comparison for T_F = T_B = T_W: bubble/ideal (p − 1)/(3m) against 1F1B's (p − 1)/m."""
    for p in range(1, 9):
        for m in range(p, 17):
            ops = simulate("zero-bubble", p, m, forward_time=1.0, backward_time=2.0)
            assert as_ratio_to_ideal(bubble(ops)) == pytest.approx((p - 1) / (3 * m), abs=1e-12)
            assert peak_in_flight(ops) == {s: min(m, p) for s in range(p)}  # 1F1B's peak p, on every device


def test_formulas_by_hand_and_conversions():
    assert gpipe_bubble(4, 8) == pytest.approx(3 / 11)
    assert gpipe_bubble(1, 5) == 0.0
    assert interleaved_bubble(4, 8, 2) == pytest.approx(3 / 16)
    assert as_fraction_of_total(3 / 16) == pytest.approx(3 / 19)
    assert as_ratio_to_ideal(3 / 19) == pytest.approx(3 / 16)
    for r in (0.0, 0.1, 1.0, 7.0):
        assert as_ratio_to_ideal(as_fraction_of_total(r)) == pytest.approx(r)
    for bad in [(0, 4), (4, 0), (2.5, 4), (True, 4)]:
        with pytest.raises((ValueError, TypeError)):
            gpipe_bubble(*bad)
    with pytest.raises(ValueError):
        interleaved_bubble(4, 8, 0)
    with pytest.raises(ValueError, match="below 1"):
        as_ratio_to_ideal(1.0)
    with pytest.raises(ValueError):
        as_fraction_of_total(-0.1)


def test_simulate_rejects_bad_settings_with_messages_that_say_what_to_change():
    with pytest.raises(ValueError, match="multiple of stages"):
        simulate("interleaved-1f1b", 4, 6, chunks=2)
    with pytest.raises(ValueError, match="interleaved-1f1b"):
        simulate("1f1b", 4, 8, chunks=2)
    with pytest.raises(ValueError, match="gpipe"):
        simulate("pipedream", 4, 8)
    with pytest.raises(TypeError):
        simulate(None, 4, 8)
    for bad in [dict(stages=0), dict(micro_batches=-1), dict(forward_time=0), dict(backward_time=float("nan")),
                dict(comm_time=-1)]:
        args = dict(kind="gpipe", stages=2, micro_batches=2) | bad
        with pytest.raises(ValueError):
            simulate(**args)
    with pytest.raises(TypeError):
        simulate("gpipe", 2.5, 4)  # a count: an integral float (2.0) is accepted, a fractional one is not
    assert simulate("gpipe", 2.0, 4.0) == simulate("gpipe", 2, 4)
    for measure in (bubble, makespan, peak_in_flight):
        with pytest.raises(ValueError):
            measure([])
        with pytest.raises(TypeError):
            measure([("F", 0, 1)])


def test_op_is_frozen_and_checked():
    op = Op(1, 0, "F", 0.0, 1.0)
    assert op.device == 1 and op.chunk == 0 and op.duration == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.start = 2.0
    for bad in [dict(kind="X"), dict(end=-1.0), dict(stage=-1), dict(micro_batch=0.5), dict(stage=1.0), dict(device=0.0)]:
        with pytest.raises((ValueError, TypeError)):
            Op(**(dict(stage=0, micro_batch=0, kind="F", start=0.0, end=1.0) | bad))


# ------------------------------------------------------------------------------------------------ pictures


def test_draw_schedule_labels_its_axes_rows_and_kinds():
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    fig = draw_schedule(simulate("zero-bubble", 4, 8), "ZB-H1")
    assert isinstance(fig, Figure) and plt.get_fignums() == before, "a Figure outside pyplot's state"
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time (units of one forward)" and ax.get_ylabel() == "device / stage"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2", "3"]
    assert ax.get_title(loc="left").startswith("ZB-H1\nbubble 11.1% of device time")
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["F forward", "B backward (input gradient)", "W weight gradient", "idle (bubble)"]
    numbers = {t.get_text() for t in ax.texts}
    assert {str(i) for i in range(8)} <= numbers
    interleaved = draw_schedule(simulate("interleaved-1f1b", 2, 4, chunks=2)).axes[0]
    assert [t.get_text() for t in interleaved.get_yticklabels()] == ["0 / 0, 2", "1 / 1, 3"]
    assert "chunks (= " in interleaved.get_title(loc="left")
    measured = draw_schedule([Op(0, 0, "F", 0.0, 2.5), Op(1, 0, "F", 2.5, 4.0)], unit="ms").axes[0]
    assert measured.get_xlabel() == "time (ms)"
    with pytest.raises(TypeError):
        draw_schedule(simulate("gpipe", 2, 2), title=3)
    plt.close("all")


def test_the_explorer_builds_redraws_and_refuses_what_torch_would(caplog, capsys):
    with caplog.at_level(logging.WARNING):
        box = schedule_explorer()
        (stages, micro_batches), (menu, chunks) = box.children[0].children, box.children[1].children
        assert stages.min == 1 and stages.max == 8 and micro_batches.min == 1 and micro_batches.max == 16
        assert box.ops == simulate("1f1b", 4, 8) and chunks.disabled
        menu.value = "interleaved-1f1b"
        assert box.ops == simulate("interleaved-1f1b", 4, 8, chunks=2) and not chunks.disabled
        micro_batches.value = 6
        assert box.ops is None
        stages.value = 3
        chunks.value = 3
        assert box.ops == simulate("interleaved-1f1b", 3, 6, chunks=3)
        menu.value = "zero-bubble"
        assert box.ops == simulate("zero-bubble", 3, 6)
        menu.value = "gpipe"
        stages.value, micro_batches.value = 8, 16
        assert box.ops == simulate("gpipe", 8, 16)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "a callback raised"
    out = capsys.readouterr().out
    assert "GPipe's formula (p−1)/(m+p−1) = 27.3%" in out and "Narayanan et al.: (p−1)/(v·m)" in out
    assert "not drawn: interleaved 1F1B takes micro-batches in rounds" in out
    assert "peak in flight per device (micro-batches whose activations it holds): 0: 4, 1: 3, 2: 2, 3: 1" in out
    assert all(len(line) <= 100 for line in out.splitlines())
    with pytest.raises(ValueError):
        schedule_explorer(kind="afab")
    matplotlib.pyplot.close("all")


# ------------------------------------------------------------------------------------------------ real models


def _mlp(width=16, depth=4):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def test_stage_costs_counts_parameters_times_each_layer_and_leaves_grad_alone():
    model = _mlp()
    rows = stage_costs(model, torch.randn(8, 16), repeat=2)
    assert [r["layer"] for r in rows] == list(range(len(model)))
    assert [r["name"] for r in rows] == [type(layer).__name__ for layer in model]
    assert [r["parameters"] for r in rows] == [16 * 16 + 16 if isinstance(l, nn.Linear) else 0 for l in model]
    for r in rows:
        assert r["forward_s"] > 0 and r["backward_s"] >= 0
        assert r["seconds"] == pytest.approx(r["forward_s"] + r["backward_s"])
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(TypeError):
        stage_costs(nn.Linear(2, 2), torch.randn(1, 2))
    with pytest.raises(ValueError):
        stage_costs(nn.Sequential(), torch.randn(1, 2))
    with pytest.raises(TypeError):
        stage_costs(model, [1.0, 2.0])
    with pytest.raises(ValueError):
        stage_costs(model, torch.randn(8, 16), repeat=0)


def test_split_by_boundaries_shares_the_layers_and_checks_the_cuts():
    model = _mlp(depth=4)  # 7 modules
    pieces = split_by_boundaries(model, [2, 5])
    assert [len(p) for p in pieces] == [2, 3, 2]
    assert [m for p in pieces for m in p] == list(model)
    x = torch.randn(3, 16)
    out = x
    for p in pieces:
        out = p(out)
    assert torch.equal(out, model(x))
    assert len(split_by_boundaries(model, [])) == 1
    for bad in ([0], [7], [3, 3], [5, 2]):
        with pytest.raises(ValueError):
            split_by_boundaries(model, bad)
    for bad in ("2", 2, [2.5], [True], [2.0]):  # a boundary is an index: an int (2.0 is refused, unlike a count)
        with pytest.raises(TypeError):
            split_by_boundaries(model, bad)
    times = stage_times(pieces, x, repeat=1)
    assert len(times) == 3 and all(t > 0 for t in times)
    with pytest.raises(TypeError):
        stage_times(model, x)


def test_naive_split_computes_what_the_model_computes_on_cpu_stand_ins():
    reference, model = _mlp(), _mlp()
    split = naive_split(model)
    assert isinstance(split, NaiveSplit) and [len(s) for s in split.stages] == [4, 3]
    if torch.cuda.device_count() < 2:
        assert split.devices == [torch.device("cpu")] * 2 and "CPU stand-ins" in split.description
    x = torch.randn(5, 16)
    torch.testing.assert_close(split(x), reference(x), rtol=0, atol=0)
    split(x).sum().backward()
    reference(x).sum().backward()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
    three = naive_split(_mlp(), ["cpu", "cpu", "cpu"])
    assert [len(s) for s in three.stages] == [3, 2, 2] and "3 stages" in three.description
    assert [len(s) for s in naive_split(_mlp(), boundaries=[1]).stages] == [1, 6]
    with pytest.raises(ValueError):
        naive_split(_mlp(depth=1), ["cpu", "cpu"])
    with pytest.raises(ValueError):
        naive_split(_mlp(), ["cpu", "cpu"], boundaries=[1, 2])
    with pytest.raises(ValueError):
        naive_split(_mlp(), ["cpu", "not a device"])
    with pytest.raises(TypeError):
        naive_split(_mlp(), "cpu")


def test_timeline_of_naive_split_shows_one_stage_working_at_a_time():
    split = naive_split(_mlp(width=64))
    ops = timeline_of_naive_split(split, torch.randn(32, 64), steps=3)
    assert [(op.stage, op.micro_batch, op.kind) for op in ops] == [
        (s, step, k) for step in range(3) for s, k in ((0, "F"), (1, "F"), (1, "B"), (0, "B"))]
    ordered = sorted(ops, key=lambda op: op.start)
    assert ordered == ops and ordered[0].start == 0.0
    assert all(a.end <= b.start for a, b in zip(ordered, ordered[1:])), "the stages take turns"
    assert bubble(ops) >= 0.5 - 1e-9, "two devices, one at a time: at least half of the device time idle"
    assert all(p.grad is None for p in split.parameters())
    assert draw_schedule(ops, "naive split", unit="ms").axes[0].get_xlabel() == "time (ms)"
    matplotlib.pyplot.close("all")
    with pytest.raises(TypeError):
        timeline_of_naive_split(_mlp(), torch.randn(2, 16))
    with pytest.raises(ValueError):
        timeline_of_naive_split(split, torch.randn(2, 64), steps=0)
    assert math.isfinite(makespan(timeline_of_naive_split(split, torch.randn(2, 64), torch.randn(2, 64), steps=1)))


# ------------------------------------------------------------------------------------------------ the package


def test_the_package_is_where_each_function_lives_for_pickles_and_the_graders():
    """Exercise 07's graders switch off the functions a lesson-07 module defines (course_lib.grading.shortcuts):
    the package counts what its own files define, and pickles find each function where it lives."""
    import pickle

    import cloudpickle

    from course_lib.grading.shortcuts import defined_in
    from course_lib.parallel import pipeline

    own = {name for name, _ in defined_in(pipeline)}
    assert {"simulate", "gpipe_bubble", "interleaved_bubble", "draw_schedule", "stage_costs", "naive_split"} <= own
    assert pickle.loads(cloudpickle.dumps(pipeline.simulate)) is pipeline.simulate
    assert set(pipeline.__all__) <= set(vars(pipeline))

