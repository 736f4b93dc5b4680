"""Graded tests for exercise 07 (notebooks/07_model_parallel.ipynb).

References are computed here, in the test process, without the learner's code: each pipeline schedule by a
time-stepped simulation (every stage holds a queue of its ops, in the order of torch's Schedule1F1B, stated the
way torch states it, with min(p - s, m) warm-up forwards, or GPipe's; at each step every stage runs its queue's
head if the op it depends on ran at an earlier step), the bubble by counting the idle slots of that simulation
and by the formula (p - 1) / (m + p - 1) in exact fractions; the best partition of the layers by a brute force
over every choice of cut points; and the tensor-parallel layers by torch's nn.Linear (and a two-layer MLP with
GELU) on the whole weight and the whole batch, in one process, forward and backward.

Generated inputs (Hypothesis): pipelines of 1 to 6 stages and 1 to 10 micro-batches (fewer, as many and more
micro-batches than stages), both kinds in any case ("GPipe", "1f1B"); bubbles up to 12 stages and 40
micro-batches; every count (stages, micro-batches) passed as an int, a numpy int or an integral float (4.0), the
course's rule for counts; arguments that are not counts (bools, fractional floats, nan and inf, 0 and below,
strs) or not kinds; cost lists of 1 to 9 layers, ints and floats, zeros, a layer a billion times the others, as
lists and as tuples, and costs from 1e300 to the largest float, whose sums overflow to inf in floats (those splits
compared in exact fractions); linear layers with and without bias, float32 and float64, inputs of 2 and 3
dimensions ((batch, features), (batch, seq, features)), batches of 1; the MLP on the default group and on groups
of two ranks made with dist.new_group; MLPs inside a model that uses their input again (a residual x + mlp(x), two
branches, x in the loss, or x without a gradient), on 3 ranks or on a subgroup of 2 of them (which 2 drawn) while
the third takes no part or works alone in a group of its own.

The tensor-parallel layers run in 1, 2, 3 and 4 gloo ranks. Every rank builds the same nn.Linear from the same
seed; inside the rank every collective is logged where every torch.distributed function passes (the process
group's methods): its kind, size, dtype, reduce op and group, so the tests check HOW the layers talk (nothing
while they are built, no all-gather or broadcast of weights, exactly one all-reduce forward and one backward in
the MLP, of the sizes Megatron-LM's layers need), not only the numbers. While the learner's code runs, torch's
pipelining schedules, torch.distributed.tensor.parallel, torch's functional collectives and the lesson's new
course_lib.parallel modules (a schedule simulator, tensor-parallel helpers) refuse to run.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from course_lib.grading import exception_raised_by, run
from course_lib.grading.audits import assert_rejects
from course_lib.grading.collective_log import CollectiveLog
from course_lib.grading.shortcuts import (defined_in, lesson_module_switch, refuser_for, replace,
                                          switch_off_shortcuts)

TIMEOUT = 60  # s: a rank waiting in an all-reduce its peers never start hangs; fail it in time
KINDS = ("gpipe", "1f1b")


# ---------------------------------------------------------------- counts and kinds as a learner passes them


def _as_passed(pair):
    value, form = pair
    return {"int": value, "float": float(value), "numpy": np.int64(value)}[form]


def counts(low, high):
    """A count (stages, micro-batches) from low to high, as a learner may pass it: an int, a numpy int, or an integral
    float such as 4.0 (the course's rule for counts, issue 34: 7.5e9 is a whole number to a learner)."""
    return st.tuples(st.integers(low, high), st.sampled_from(["int", "float", "numpy"])).map(_as_passed)


def _spelled(kind, upper):
    return "".join(c.upper() if up else c for c, up in zip(kind, upper))


# A kind in any case: "GPipe" and "1F1B", as the papers write them, are the same kinds as "gpipe" and "1f1b".
kinds = st.sampled_from(KINDS).flatmap(
    lambda kind: st.lists(st.booleans(), min_size=len(kind), max_size=len(kind)).map(lambda up: _spelled(kind, up)))

# What is not a count: bools (True is an int to isinstance), fractional floats, nan and inf, 0 and below, strs, None.
bad_counts = (st.sampled_from([True, False, 0, -1, 0.0, -2.0, 4.5, 0.5, math.nan, math.inf, -math.inf, "4", None,
                               np.float64(2.5), np.int64(0), [4]])
              | st.integers(max_value=0)
              | st.floats().filter(lambda v: not (math.isfinite(v) and v.is_integer() and v >= 1)))


def _result_types(value):
    """What a learner's return value is made of, as plain data (type names, nested like the value)."""
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [_result_types(v) for v in value]]
    return type(value).__name__


# ---------------------------------------------------------------- shortcuts switched off in the child

# course_lib.parallel's modules of lessons 02-05 stay allowed
LESSON_MODULES = ("streams", "data_parallel", "links", "ddp", "ddp_pictures")


_refuser = refuser_for("07", "plain Python for the bubble, the schedules and the partition; slices of the weight "
                             "and dist.all_reduce for the tensor-parallel layers")


def _replace(module, name, label, replaced):
    replace(module, name, _refuser(label), replaced)


def _switch_off_schedules(module, replaced):
    """torch.distributed.pipelining.schedules: every schedule class refuses to be built, every function to run."""
    base = getattr(module, "_PipelineSchedule", None)
    for name, value in defined_in(module):
        if isinstance(value, type):
            if base is not None and issubclass(value, base):
                value.__init__ = _refuser(f"torch's {name}")
        else:
            _replace(module, name, f"torch.distributed.pipelining.schedules.{name}", replaced)


def _switch_off_tensor_parallel(module, replaced):
    """torch.distributed.tensor.parallel (and its api and style modules): parallelize_module and the styles refuse."""
    if hasattr(module, "parallelize_module"):
        _replace(module, "parallelize_module", "torch.distributed.tensor.parallel.parallelize_module", replaced)
    for name, value in list(vars(module).items()):
        if isinstance(value, type) and name.endswith("Parallel"):
            value.__init__ = _refuser(f"torch's {name}")


def _switcher(fullname):
    """Which switch applies to the module of this name, or None."""
    if fullname == "torch.distributed.pipelining.schedules":
        return _switch_off_schedules
    if fullname == "torch.distributed.tensor.parallel" or fullname.startswith("torch.distributed.tensor.parallel."):
        return _switch_off_tensor_parallel
    # a new course_lib.parallel module (lesson 07's schedule simulator, tensor-parallel helpers): all of it refuses
    return lesson_module_switch(fullname, LESSON_MODULES, _refuser)


def _switch_off_shortcuts(learner):
    """In the child: the shortcuts refuse to run (course_lib.grading.shortcuts)."""
    switch_off_shortcuts(learner, _switcher, _refuser)


# ---------------------------------------------------------------- the reference schedules


def _queue(p, m, s, kind):
    """Stage s's ops in order, as torch states them: GPipe's, or Schedule1F1B's min(p - s, m) warm-up forwards,
    then one backward and one forward while forwards are left, then the remaining backwards."""
    if kind == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    warmup = min(p - s, m)
    ops = [("F", j) for j in range(warmup)]
    forwards, backwards = warmup, 0
    while backwards < m:
        ops.append(("B", backwards))
        backwards += 1
        if forwards < m:
            ops.append(("F", forwards))
            forwards += 1
    return ops


def _needs(op, p, s, j):
    """The op that (op, s, j) waits for, or None."""
    if op == "F":
        return ("F", s - 1, j) if s > 0 else None
    return ("F", s, j) if s == p - 1 else ("B", s + 1, j)


def _reference_schedule(p, m, kind):
    """A time-stepped simulation: at each step every stage runs the head of its queue if what it waits for ran at
    an earlier step. Returns [[time_step, stage, micro_batch, op], ...] sorted by (time_step, stage)."""
    queues = [_queue(p, m, s, kind) for s in range(p)]
    heads, done, ops, step = [0] * p, set(), [], 0
    while any(heads[s] < len(queues[s]) for s in range(p)):
        ran = []
        for s in range(p):
            if heads[s] < len(queues[s]):
                op, j = queues[s][heads[s]]
                needs = _needs(op, p, s, j)
                if needs is None or needs in done:
                    ran.append((op, s, j))
        for op, s, j in ran:  # done only after the step: an op never waits for one in the same step
            done.add((op, s, j))
            heads[s] += 1
            ops.append([step, s, j, op])
        step += 1
        assert step <= 4 * (m + p), "the reference simulation is stuck"
    return ops


def _grid(ops, p, limit=40):
    """The schedule drawn one line per stage, one cell per time step ("F3", "B0" or ".."), for messages."""
    steps = max((op[0] for op in ops), default=-1) + 1
    cells = [[".."] * min(steps, limit) for _ in range(p)]
    for t, s, j, op in ops:
        if 0 <= s < p and 0 <= t < limit:
            cells[s][t] = f"{op}{j}"
    width = max((len(c) for row in cells for c in row), default=2)
    lines = [f"    stage {s}: " + " ".join(c.rjust(width) for c in row) for s, row in enumerate(cells)]
    return "\n".join(lines) + ("\n    ..." if steps > limit else "")


# ---------------------------------------------------------------- bubble_fraction


def _bubble_driver(module, cases):
    _switch_off_shortcuts(module)
    out = []
    for p, m in cases:
        value = module.bubble_fraction(p, m)
        out.append([type(value).__name__, float(value) if isinstance(value, (int, float)) else None])
    return out


def _idle_fraction(ops, p):
    """The idle slots of a schedule over all its slots (p stages times its length), exactly."""
    steps = max(op[0] for op in ops) + 1
    return Fraction(p * steps - len(ops), p * steps)


bubble_cases = st.tuples(counts(1, 12), counts(1, 40))
BUBBLE_CASES = [(1, 1), (1, 7), (2, 1), (4, 4), (4, 16), (8, 32), (5, 3), (12, 40), (4.0, 16.0), (np.int64(3), 5.0)]


@pytest.mark.points(2)
@settings(max_examples=4)
@given(cases=st.lists(bubble_cases, min_size=1, max_size=8))
@example(cases=BUBBLE_CASES)
def test_bubble_fraction_matches_the_idle_slots(cases):
    got = run("ex07", _bubble_driver, cases, timeout=TIMEOUT)
    for (given_p, given_m), (kind, value) in zip(cases, got):
        where, p, m = f"bubble_fraction({given_p!r}, {given_m!r})", int(given_p), int(given_m)
        counted = _idle_fraction(_reference_schedule(p, m, "gpipe"), p)
        assert counted == Fraction(p - 1, m + p - 1)
        assert kind == "float", f"{where} must return a Python float, got a {kind}"
        assert math.isclose(value, float(counted), rel_tol=1e-12, abs_tol=1e-15), (
            f"{where} should be {float(counted)!r}: a GPipe step of {p} stage(s) and {m} micro-batch(es) takes "
            f"2(m + p - 1) = {2 * (m + p - 1)} time units, each stage busy 2m = {2 * m} of them, so "
            f"(p - 1) / (m + p - 1) = {counted} of the slots are idle; got {value!r}")


BAD_COUNTS = [((0, 4), "stages"), ((-1, 4), "stages"), ((True, 4), "stages"), ((2.5, 4), "stages"),
              (("4", 4), "stages"), ((math.nan, 4), "stages"), ((4, 0), "micro_batches"), ((4, -3), "micro_batches"),
              ((4, False), "micro_batches"), ((4, 1.5), "micro_batches"), ((4, None), "micro_batches"),
              ((4.0, True), "micro_batches"), ((np.int64(2), math.inf), "micro_batches")]


@st.composite
def bad_count_calls(draw, good=counts(1, 12)):
    """(stages, micro_batches) with one of them not a count (drawn), the other one a count in any form; its name."""
    broken = draw(st.sampled_from(["stages", "micro_batches"]))
    bad, fine = draw(bad_counts), draw(good)
    return ((bad, fine) if broken == "stages" else (fine, bad)), broken


def _bad_bubble_driver(module, cases):
    return [exception_raised_by(module.bubble_fraction, p, m) for p, m in cases]


@pytest.mark.points(1)
@settings(max_examples=3)
@given(calls=st.lists(bad_count_calls(), min_size=1, max_size=10))
@example(calls=BAD_COUNTS)
def test_bubble_fraction_rejects_bad_arguments(calls):
    got = run("ex07", _bad_bubble_driver, [call for call, _ in calls], timeout=TIMEOUT)
    for ((p, m), broken), (raised, message) in zip(calls, got):
        assert_rejects(f"bubble_fraction({p!r}, {m!r})", raised, message, broken)


# ---------------------------------------------------------------- pipeline_schedule


def _schedule_driver(module, cases):
    _switch_off_shortcuts(module)
    out = []
    for p, m, kind in cases:
        result = module.pipeline_schedule(p, m, kind)
        ops = None
        if isinstance(result, (list, tuple)) and all(isinstance(op, (list, tuple)) and len(op) == 4 for op in result):
            ops = [[int(t) if isinstance(t, int) else None, int(s) if isinstance(s, int) else None,
                    int(j) if isinstance(j, int) else None, str(op)] for t, s, j, op in result]
        out.append({"types": _result_types(result), "ops": ops})
    return out


def _call(p, m, kind):
    return f"pipeline_schedule({p!r}, {m!r}, {kind!r})"


def _check_types(result, where):
    types = result["types"]
    kind = types[0] if isinstance(types, list) else types
    assert kind == "list", f"{where} must return a list of tuples, got a {kind}"
    items = types[1]
    bad = next((item for item in items if item != ["tuple", ["int", "int", "int", "str"]]), None)
    assert bad is None, (
        f"{where}: every op must be a tuple (time_step, stage, micro_batch, 'F' or 'B') of three Python ints and a "
        f"str; one is {bad[0] if isinstance(bad, list) else bad} of {bad[1] if isinstance(bad, list) else ''}")
    return result["ops"]


schedule_cases = st.tuples(counts(1, 6), counts(1, 10), kinds)
# Always run: one stage, one micro-batch, fewer micro-batches than stages, as many, more, the largest; the kinds
# as the papers write them ("GPipe", "1F1B"), counts as floats and numpy ints (the ops are Python ints all the same).
SCHEDULE_CASES = [(1, 1, "gpipe"), (1, 4, "1f1b"), (2, 2, "gpipe"), (4, 1, "1f1b"), (4, 3, "1f1b"),
                  (4, 4, "1f1b"), (4, 8, "1f1b"), (3, 5, "gpipe"), (6, 10, "1f1b"), (6, 10, "gpipe"), (5, 2, "gpipe"),
                  (3, 4, "GPipe"), (4.0, 6.0, "1F1B"), (np.int64(3), 2, "GPIPE")]


@pytest.mark.points(3)
@settings(max_examples=5)
@given(cases=st.lists(schedule_cases, min_size=1, max_size=8))
@example(cases=SCHEDULE_CASES)
def test_pipeline_schedule_matches_a_simulation(cases):
    got = run("ex07", _schedule_driver, cases, timeout=TIMEOUT)
    for (given_p, given_m, given_kind), result in zip(cases, got):
        where = _call(given_p, given_m, given_kind)
        p, m, kind = int(given_p), int(given_m), given_kind.lower()
        ops = _check_types(result, where)
        want = _reference_schedule(p, m, kind)
        if ops == want:
            continue
        first = next((i for i, (a, b) in enumerate(zip(ops, want)) if a != b), min(len(ops), len(want)))
        raise AssertionError(
            f"{where} differs from the schedule a step-by-step simulation gives (each stage works through its list "
            f"of ops in order, each op at the first step after its stage's previous op and after the op it waits "
            f"for); sorted by (time_step, stage), op {first} should be "
            f"{tuple(want[first]) if first < len(want) else 'absent'}, got "
            f"{tuple(ops[first]) if first < len(ops) else 'nothing'}.\n  expected:\n{_grid(want, p)}\n"
            f"  got:\n{_grid(ops, p)}")


def _check_structure(ops, p, m, where):
    """Every op once, a valid step and stage, one op per stage per step, sorted, every dependency kept."""
    expected = sorted((s, j, op) for s in range(p) for j in range(m) for op in "FB")
    assert sorted((s, j, op) for _, s, j, op in ops) == expected, (
        f"{where}: every stage must run every micro-batch's forward and backward exactly once ({2 * m * p} ops); "
        f"the ops (stage, micro_batch, op) listed are not that: {len(ops)} ops, for example "
        f"{sorted(set((s, j, op) for _, s, j, op in ops) ^ set(expected))[:4]} is missing or extra")
    assert all(t is not None and t >= 0 for t, *_ in ops), f"{where}: time steps count from 0"
    slots = [(t, s) for t, s, _, _ in ops]
    assert len(set(slots)) == len(slots), (
        f"{where}: a stage runs one op per time step; these (time_step, stage) slots hold two ops: "
        f"{sorted({slot for slot in slots if slots.count(slot) > 1})[:4]}")
    assert slots == sorted(slots), f"{where}: return the ops sorted by (time_step, stage)"
    when = {(op, s, j): t for t, s, j, op in ops}
    for t, s, j, op in ops:
        needs = _needs(op, p, s, j)
        if needs is not None:
            assert when[needs] < t, (
                f"{where}: {op}(stage {s}, micro-batch {j}) at step {t} needs {needs[0]}(stage {needs[1]}, "
                f"micro-batch {needs[2]}) done at an EARLIER step, but that runs at step {when[needs]}"
                f"\n{_grid(ops, p)}")
    for s in range(p):
        for op in "FB":
            order = [j for _, stage, j, o in ops if stage == s and o == op]
            assert order == list(range(m)), (
                f"{where}: stage {s} must run its {'forwards' if op == 'F' else 'backwards'} in micro-batch order "
                f"0, 1, ..., {m - 1}; it runs them in the order {order}\n{_grid(ops, p)}")


@pytest.mark.points(2)
@settings(max_examples=5)
@given(cases=st.lists(schedule_cases, min_size=1, max_size=8))
@example(cases=SCHEDULE_CASES)
def test_pipeline_schedule_keeps_every_dependency(cases):
    got = run("ex07", _schedule_driver, cases, timeout=TIMEOUT)
    for (given_p, given_m, given_kind), result in zip(cases, got):
        where = _call(given_p, given_m, given_kind)
        p, m, kind = int(given_p), int(given_m), given_kind.lower()
        ops = _check_types(result, where)
        _check_structure(ops, p, m, where)
        steps = max(t for t, *_ in ops) + 1
        assert steps == 2 * (m + p - 1), (
            f"{where} takes {steps} time steps; with every op as early as its dependencies allow it takes "
            f"2(m + p - 1) = {2 * (m + p - 1)}\n{_grid(ops, p)}")


def _peak_in_flight(ops, s):
    """The most micro-batches stage s holds activations for at once: forwarded, not yet backwarded."""
    held = peak = 0
    for _, stage, _, op in ops:
        if stage == s:
            held += 1 if op == "F" else -1
            peak = max(peak, held)
    return peak


@pytest.mark.points(2)
@settings(max_examples=5)
@given(cases=st.lists(schedule_cases, min_size=1, max_size=8))
@example(cases=SCHEDULE_CASES)
def test_pipeline_schedule_bubble_and_activation_memory(cases):
    got = run("ex07", _schedule_driver, cases, timeout=TIMEOUT)
    for (given_p, given_m, given_kind), result in zip(cases, got):
        where = _call(given_p, given_m, given_kind)
        p, m, kind = int(given_p), int(given_m), given_kind.lower()
        ops = _check_types(result, where)
        _check_structure(ops, p, m, where)
        idle, want = _idle_fraction(ops, p), Fraction(p - 1, m + p - 1)
        assert idle == want, (
            f"{where}: {idle} of the slots (stages x time steps) are idle; GPipe's bubble is (p - 1) / (m + p - 1) = "
            f"{want}, and 1F1B has the same: run each op as early as it can\n{_grid(ops, p)}")
        peaks = [_peak_in_flight(ops, s) for s in range(p)]
        if kind == "gpipe":
            assert peaks[0] == m, (
                f"{where}: GPipe runs all forwards before any backward, so stage 0 holds the activations of all {m} "
                f"micro-batches at once; it held at most {peaks[0]}\n{_grid(ops, p)}")
        else:
            over = [s for s in range(p) if peaks[s] > p - s]
            assert not over, (
                f"{where}: in 1F1B stage s holds at most p - s micro-batches' activations (p - s - 1 warm-up "
                f"forwards, then one forward and one backward in turn); stage {over[0]} held {peaks[over[0]]}, "
                f"more than {p - over[0]} (peaks per stage: {peaks})\n{_grid(ops, p)}")


BAD_SCHEDULES = [((0, 4, "1f1b"), "stages"), ((True, 4, "gpipe"), "stages"), ((2.5, 4, "gpipe"), "stages"),
                 ((4, 0, "1f1b"), "micro_batches"), ((4, False, "1f1b"), "micro_batches"),
                 ((4, "8", "gpipe"), "micro_batches"), ((4.0, math.nan, "GPipe"), "micro_batches"),
                 ((2, 2, "interleaved"), "kind"), ((2, 2, ""), "kind"), ((2, 2, None), "kind"),
                 ((3, 6, "zero-bubble"), "kind"), ((2, 2, "gpipe "), "kind"), ((2, 2, 1), "kind")]
# Not a kind, in any case: other schedules' names, near misses, not a str at all.
bad_kinds = (st.sampled_from(["interleaved", "interleaved-1f1b", "zero-bubble", "", "gpipe ", " 1f1b", "g-pipe",
                              "1f1b\n", "1F1B2", b"gpipe", None, 1, ("gpipe",)])
             | st.text(max_size=6).filter(lambda text: text.lower() not in KINDS))


@st.composite
def bad_schedule_calls(draw):
    """(stages, micro_batches, kind) with one of the three wrong (drawn), the others right in any form; its name."""
    call = [draw(counts(1, 6)), draw(counts(1, 6)), draw(kinds)]
    broken = draw(st.sampled_from(["stages", "micro_batches", "kind"]))
    call[["stages", "micro_batches", "kind"].index(broken)] = draw(bad_kinds if broken == "kind" else bad_counts)
    return tuple(call), broken


def _bad_schedule_driver(module, cases):
    _switch_off_shortcuts(module)
    return [exception_raised_by(module.pipeline_schedule, p, m, kind) for p, m, kind in cases]


@pytest.mark.points(1)
@settings(max_examples=3)
@given(calls=st.lists(bad_schedule_calls(), min_size=1, max_size=10))
@example(calls=BAD_SCHEDULES)
def test_pipeline_schedule_rejects_bad_arguments(calls):
    got = run("ex07", _bad_schedule_driver, [call for call, _ in calls], timeout=TIMEOUT)
    for ((p, m, kind), broken), (raised, message) in zip(calls, got):
        where = f"pipeline_schedule({p!r}, {m!r}, {kind!r})"
        assert_rejects(where, raised, message, broken, say_what=False)
        if broken == "kind":
            assert "gpipe" in message and "1f1b" in message, (
                f"{where}: the ValueError should list the kinds there are, 'gpipe' and '1f1b'; it says {message!r}")


# ---------------------------------------------------------------- partition


def _partition_driver(module, cases):
    _switch_off_shortcuts(module)
    out = []
    for costs, stages, as_tuple in cases:
        given_costs = tuple(costs) if as_tuple else list(costs)
        before = [(type(c).__name__, c) for c in given_costs]
        result = module.partition(given_costs, stages)
        groups = None
        if isinstance(result, (list, tuple)) and all(isinstance(g, (list, tuple)) for g in result):
            groups = [[int(i) if isinstance(i, int) else -1 for i in g] for g in result]
        out.append({"types": _result_types(result), "groups": groups, "is_input": result is given_costs,
                    "unchanged": type(given_costs) is (tuple if as_tuple else list)
                    and [(type(c).__name__, c) for c in given_costs] == before})
    return out


def _best_split(costs, stages):
    """The smallest possible cost of the costliest stage, by trying every choice of stages - 1 cut points."""
    n, best = len(costs), math.inf
    for cuts in combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(math.fsum(costs[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


def _stage_costs(costs, groups):
    return [math.fsum(costs[i] for i in group) for group in groups]


def _check_groups(result, costs, stages, where):
    types = result["types"]
    assert isinstance(types, list) and types[0] == "list" and all(isinstance(t, list) and t[0] == "list" for t in types[1]), (
        f"{where} must return a list of lists of layer indices (one list per stage), got {types}")
    assert all(t == "int" for group in types[1] for t in group[1]), (
        f"{where}: every layer index must be a Python int, got {types}")
    groups = result["groups"]
    assert len(groups) == stages, f"{where}: {stages} stages, so {stages} lists, got {len(groups)}: {groups}"
    assert all(groups), f"{where}: every stage needs at least one layer; got {groups}"
    assert [i for group in groups for i in group] == list(range(len(costs))), (
        f"{where}: the stages must be contiguous runs of layers 0 .. {len(costs) - 1}, in order, each layer once; "
        f"got {groups}")
    return groups


cost_values = (st.integers(0, 20) | st.floats(0, 100, allow_nan=False, allow_infinity=False)
               | st.sampled_from([0, 0.0, 0.5, 1e9]))


@st.composite
def partition_cases(draw):
    costs = draw(st.lists(cost_values, min_size=1, max_size=9))
    if draw(st.integers(0, 3)) == 0:  # one layer far costlier than the others (an embedding, a vocabulary head)
        costs[draw(st.integers(0, len(costs) - 1))] = draw(st.sampled_from([1e9, 10**7, 123456.5]))
    return costs, draw(counts(1, len(costs))), draw(st.booleans())


# Always run: balanced ends, a huge first layer, all zeros, one layer, a stage per layer, costs where filling
# each stage up to the average goes wrong ([2, 2, 3, 3] in 2: the average 5 is reached only by 2 + 3, and a
# greedy fill leaves [2, 2] and [3, 3]; [5, 1, 1, 1, 1, 1, 5] in 3), a huge last layer, floats.
PARTITION_CASES = [([4, 1, 1, 1, 1, 4], 3, False), ([10**9, 1, 2, 3], 2, True), ([0, 0, 0, 0], 3, False),
                   ([5], 1, True), ([3, 3, 3, 3], 4, False), ([2, 2, 3, 3], 2, False), ([5, 1, 1, 1, 1, 1, 5], 3, True),
                   ([1, 1, 1, 1, 1, 1, 1, 1, 100], 4, False), ([1.5, 0.25, 2.75, 0.5, 3.0], 2, True),
                   ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3, False), ([7, 2, 2, 2, 2, 2, 2, 7], 4, True),
                   ([3, 1, 4, 1, 5], 2.0, False), ([2, 7, 1, 8], np.int64(3), True)]


@pytest.mark.points(3)
@settings(max_examples=6)
@given(cases=st.lists(partition_cases(), min_size=1, max_size=8))
@example(cases=PARTITION_CASES)
def test_partition_minimises_the_costliest_stage(cases):
    got = run("ex07", _partition_driver, cases, timeout=TIMEOUT)
    for (costs, stages, as_tuple), result in zip(cases, got):
        where = f"partition({tuple(costs) if as_tuple else costs}, {stages!r})"
        stages = int(stages)  # passed as an int, a numpy int or an integral float
        groups = _check_groups(result, costs, stages, where)
        best, stage_costs = _best_split(costs, stages), _stage_costs(costs, groups)
        assert max(stage_costs) <= best * (1 + 1e-9) + 1e-12, (
            f"{where}: the costliest of your stages {groups} costs {max(stage_costs)!r} (stage costs {stage_costs}), "
            f"but a split whose costliest stage costs {best!r} exists (found by trying every split): choose the "
            f"boundaries that minimise the LARGEST stage cost, not the first fit")


@pytest.mark.points(2)
@settings(max_examples=4)
@given(cases=st.lists(partition_cases(), min_size=1, max_size=8))
@example(cases=PARTITION_CASES)
def test_partition_returns_contiguous_stages(cases):
    got = run("ex07", _partition_driver, cases, timeout=TIMEOUT)
    for (costs, stages, as_tuple), result in zip(cases, got):
        where = f"partition({tuple(costs) if as_tuple else costs}, {stages!r})"
        stages = int(stages)  # passed as an int, a numpy int or an integral float
        _check_groups(result, costs, stages, where)
        assert not result["is_input"], f"{where}: return a new list, not costs"
        assert result["unchanged"], f"{where} changed its argument costs (a {'tuple' if as_tuple else 'list'}): leave it"


def _exact_best_split(costs, stages):
    """_best_split in exact fractions: near the largest float a sum of costs overflows to inf (and math.fsum raises)."""
    n, best = len(costs), None
    for cuts in combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        largest = max(sum(map(Fraction, costs[a:b])) for a, b in zip(bounds, bounds[1:]))
        best = largest if best is None else min(best, largest)
    return best


huge_costs = (st.floats(1e300, sys.float_info.max, allow_nan=False, allow_infinity=False)
              | st.sampled_from([1e308, sys.float_info.max, 1.0, 0.0]))


@st.composite
def huge_partition_cases(draw):
    costs = draw(st.lists(huge_costs, min_size=2, max_size=7))
    return costs, draw(counts(2, len(costs))), draw(st.booleans())


# Each one's total is beyond the largest float (about 1.8e308), so a running sum of the costs reaches inf.
HUGE_PARTITIONS = [([1e308, 1e308], 2, False), ([sys.float_info.max] * 4, 2, True), ([1e308] * 3, 2, False),
                   ([1e308, 1.0, 1e308, 1e308], 3, True), ([1.5e308, 1e308, 0.0, 1.7e308], 2, False)]


@pytest.mark.points(1)
@settings(max_examples=4)
@given(cases=st.lists(huge_partition_cases(), min_size=1, max_size=6))
@example(cases=HUGE_PARTITIONS)
def test_partition_handles_costs_near_the_float_maximum(cases):
    got = run("ex07", _partition_driver, cases, timeout=TIMEOUT)
    for (costs, stages, as_tuple), result in zip(cases, got):
        where = f"partition({tuple(costs) if as_tuple else costs}, {stages!r})"
        stages = int(stages)  # passed as an int, a numpy int or an integral float
        groups = result["groups"]
        assert groups is None or len(groups) != stages or all(groups), (
            f"{where} left a stage empty: {groups}. These costs are finite, but their sum is not: 1e308 + 1e308 "
            f"is inf in floats, so every split looks as bad as any other (inf), and inf - inf is nan. Keep the "
            f"sums finite, e.g. divide every cost by the same power of two (math.frexp, math.ldexp)")
        groups = _check_groups(result, costs, stages, where)
        best = _exact_best_split(costs, stages)
        largest = max(sum(Fraction(costs[i]) for i in group) for group in groups)
        assert largest <= best * (1 + Fraction(1, 10**9)), (
            f"{where}: the costliest of your stages {groups} costs {float(largest):.6g}, but a split whose "
            f"costliest stage costs {float(best):.6g} exists (found by trying every split, in exact fractions)")


BAD_PARTITIONS = [(([], 1), "costs"), (((), 1), "costs"), (([1, -1], 1), "costs"), (([1, math.nan], 1), "costs"),
                  (([1, math.inf], 2), "costs"), (([1, "2"], 1), "costs"), (([3, None, 2], 2), "costs"),
                  ((range(1, 4), 2), "costs"), (({0: 1.0, 1: 2.0}, 1), "costs"), (({1, 2}, 1), "costs"),
                  (([1, 2], 0), "stages"), (([1, 2], 3), "stages"), (([1, 2], 1.5), "stages"),
                  (([1, 2], True), "stages"), (([1, 2, 3], -1), "stages"), (([1, 2], 3.0), "stages"),
                  (([4, 5, 6], math.nan), "stages")]


@st.composite
def bad_partition_calls(draw):
    """partition(costs, stages) with good costs and stages that is not a count, or more stages than layers."""
    costs = draw(st.lists(st.integers(0, 9), min_size=1, max_size=5))
    stages = draw(bad_counts | counts(len(costs) + 1, len(costs) + 3))
    return (costs, stages), "stages"


def _bad_partition_driver(module, cases):
    _switch_off_shortcuts(module)
    return [exception_raised_by(module.partition, costs, stages) for costs, stages in cases]


@pytest.mark.points(1)
@settings(max_examples=3)
@given(calls=st.lists(bad_partition_calls(), min_size=1, max_size=10))
@example(calls=BAD_PARTITIONS)
def test_partition_rejects_bad_arguments(calls):
    got = run("ex07", _bad_partition_driver, [call for call, _ in calls], timeout=TIMEOUT)
    for ((costs, stages), broken), (raised, message) in zip(calls, got):
        assert_rejects(f"partition({costs!r}, {stages!r})", raised, message, broken)


# ---------------------------------------------------------------- tensor parallelism: the ranks' side

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _make_linear(in_features, out_features, bias, dtype, seed):
    """The same nn.Linear in every process: weights drawn from a generator seeded with `seed`."""
    linear = nn.Linear(in_features, out_features, bias=bias, dtype=DTYPES[dtype])
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out_features, in_features, generator=generator, dtype=DTYPES[dtype]))
        if bias:
            linear.bias.copy_(torch.randn(out_features, generator=generator, dtype=DTYPES[dtype]))
    return linear


def _data(case, features, which):
    """The case's input (which=1) or output gradient (which=2): shape case["lead"] + [features], the same everywhere."""
    generator = torch.Generator().manual_seed(1000 * case["seed"] + which)
    return torch.randn(*case["lead"], features, generator=generator, dtype=DTYPES[case["dtype"]])


def _grad(tensor):
    return None if tensor is None or tensor.grad is None else tensor.grad.detach().clone()


def _shapes(layer):
    weight, bias = getattr(layer, "weight", None), getattr(layer, "bias", None)
    return {"weight": list(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__,
            "bias": list(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__}


def _layer_driver(rank, world_size, module, kind, cases):
    """Build the learner's ColumnParallelLinear or RowParallelLinear, run forward and backward; what happened."""
    _switch_off_shortcuts(module)
    out = []
    with CollectiveLog() as log:
        for case in cases:
            if kind == "column":
                in_features, out_features, block = case["in"], case["out"] * world_size, case["out"]
            else:
                in_features, out_features, block = case["in"] * world_size, case["out"], case["in"]
            linear = _make_linear(in_features, out_features, case["bias"], case["dtype"], case["seed"])
            full_x, full_g = _data(case, in_features, 1), _data(case, out_features, 2)
            mine = slice(rank * block, (rank + 1) * block)
            x = (full_x if kind == "column" else full_x[..., mine].clone()).requires_grad_()
            g = full_g[..., mine] if kind == "column" else full_g
            start = len(log.events)
            layer = (module.ColumnParallelLinear if kind == "column" else module.RowParallelLinear)(linear)
            y = layer(x)
            info = {"type": type(y).__name__, "shapes": _shapes(layer), "events": log.events[start:]}
            if isinstance(y, torch.Tensor):
                info.update(shape=list(y.shape), dtype=str(y.dtype), y=y.detach().clone())
                if y.shape == g.shape and y.requires_grad:
                    (y * g).sum().backward()
                    info.update(x_grad=_grad(x), weight_grad=_grad(getattr(layer, "weight", None)),
                                bias_grad=_grad(getattr(layer, "bias", None)))
            out.append(info)
    return out


def _reference_layer(case, in_features, out_features):
    """nn.Linear on the whole input, in this process: output, and the gradients of sum(output * g)."""
    linear = _make_linear(in_features, out_features, case["bias"], case["dtype"], case["seed"])
    x = _data(case, in_features, 1).requires_grad_()
    y = linear(x)
    (y * _data(case, out_features, 2)).sum().backward()
    return {"y": y.detach(), "x_grad": x.grad, "weight_grad": linear.weight.grad,
            "bias_grad": linear.bias.grad if case["bias"] else None, "bias": linear.bias.detach() if case["bias"] else None}


def _describe(case, in_features, out_features, world_size):
    shape = tuple(case["lead"]) + (in_features,)
    return (f"nn.Linear({in_features}, {out_features}, bias={case['bias']}) in {world_size} rank(s), input of shape "
            f"{shape}, {case['dtype']}")


def _close(got, want, message):
    torch.testing.assert_close(got, want, msg=lambda m: f"{message}\n{m}")


tp_cases = st.fixed_dictionaries({
    "lead": st.sampled_from([[1], [3], [2, 3], [1, 1], [4, 2]]) | st.lists(st.integers(1, 3), min_size=1, max_size=2),
    "in": st.integers(1, 4), "out": st.integers(1, 4), "bias": st.booleans(),
    "dtype": st.sampled_from(sorted(DTYPES)), "seed": st.integers(0, 10**4)})
# Always run: a batch of one row, a 3-d input (batch, seq, features) in float64, a layer without bias, one
# feature per rank.
TP_CASES = [{"lead": [1], "in": 3, "out": 2, "bias": True, "dtype": "float32", "seed": 1},
            {"lead": [2, 3], "in": 2, "out": 3, "bias": True, "dtype": "float64", "seed": 2},
            {"lead": [4], "in": 5, "out": 1, "bias": False, "dtype": "float32", "seed": 3},
            {"lead": [3, 1], "in": 1, "out": 2, "bias": True, "dtype": "float64", "seed": 4}]


def _check_output_type(info, want_shape, dtype, where):
    assert info["type"] == "Tensor", f"{where}: forward must return a torch.Tensor, got {info['type']}"
    assert info["shape"] == list(want_shape), (
        f"{where}: forward should return shape {tuple(want_shape)}, got {tuple(info['shape'])}")
    assert info["dtype"] == f"torch.{dtype}", f"{where}: the output must keep the input's dtype torch.{dtype}"
    assert "x_grad" in info, f"{where}: the output must be part of the autograd graph (backward through it)"


@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [1, 2, 4])
@settings(max_examples=2)
@given(cases=st.lists(tp_cases, min_size=1, max_size=3))
@example(cases=TP_CASES)
def test_column_parallel_linear_matches_nn_linear(world_size, cases):
    got = run("ex07", _layer_driver, "column", cases, world_size=world_size, timeout=TIMEOUT)
    for index, case in enumerate(cases):
        in_features, out_features, block = case["in"], case["out"] * world_size, case["out"]
        want = _reference_layer(case, in_features, out_features)
        for rank in range(world_size):
            info = got[rank][index]
            mine = slice(rank * block, (rank + 1) * block)
            where = (f"ColumnParallelLinear({_describe(case, in_features, out_features, world_size)}), rank {rank}, "
                     f"output features {mine.start} .. {mine.stop - 1}")
            assert info["shapes"]["weight"] == [block, in_features], (
                f"{where}: self.weight should be this rank's {block} rows of the weight, shape ({block}, "
                f"{in_features}), got {info['shapes']['weight']}")
            _check_output_type(info, list(case["lead"]) + [block], case["dtype"], where)
            _close(info["y"], want["y"][..., mine],
                   f"{where}: forward should return this rank's slice of linear(x), columns {mine.start} .. "
                   f"{mine.stop - 1} of the output (rows {mine.start} .. {mine.stop - 1} of the weight and the bias)")
            assert info["x_grad"] is not None, f"{where}: x got no gradient"
            _close(info["x_grad"], want["x_grad"],
                   f"{where}: the gradient with respect to x must be the whole gradient, the SUM over the ranks of "
                   f"each rank's part (g_r @ W_r): all-reduce it in backward (an autograd Function that is the "
                   f"identity in forward), never in forward")
            assert info["weight_grad"] is not None, f"{where}: self.weight got no gradient (keep it an nn.Parameter)"
            _close(info["weight_grad"], want["weight_grad"][mine],
                   f"{where}: self.weight.grad should be rows {mine.start} .. {mine.stop - 1} of nn.Linear's weight "
                   f"gradient")
            if case["bias"]:
                assert info["shapes"]["bias"] == [block], f"{where}: self.bias should be this rank's {block} entries"
                assert info["bias_grad"] is not None, f"{where}: self.bias got no gradient"
                _close(info["bias_grad"], want["bias_grad"][mine],
                       f"{where}: self.bias.grad should be entries {mine.start} .. {mine.stop - 1} of nn.Linear's "
                       f"bias gradient")
            else:
                assert info["shapes"]["bias"] == "NoneType", f"{where}: the layer has no bias: self.bias is None"


def _row_hint(got, want, world_size):
    """What the usual mistake is, for a RowParallelLinear output that differs from nn.Linear's."""
    if world_size > 1 and want["bias"] is not None and torch.allclose(got, want["y"] + (world_size - 1) * want["bias"]):
        return (f"the bias was added {world_size} times: add it ONCE, after the all-reduce, not on every rank "
                "before it")
    if world_size > 1:
        partial = want["y"] - (want["bias"] if want["bias"] is not None else 0)
        if want["bias"] is not None and torch.allclose(got, partial / world_size + want["bias"]):
            return "that is the MEAN of the ranks' partial products: the all-reduce must SUM them"
        if torch.allclose(got, partial / world_size) or torch.allclose(got, want["y"] / world_size):
            return "that is the MEAN of the ranks' partial products: the all-reduce must SUM them"
    return ("compute x_r @ W_r.T with this rank's block of columns, all-reduce (sum) it, then add the whole bias "
            "once")


@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [1, 2, 4])
@settings(max_examples=2)
@given(cases=st.lists(tp_cases, min_size=1, max_size=3))
@example(cases=TP_CASES)
def test_row_parallel_linear_matches_nn_linear(world_size, cases):
    got = run("ex07", _layer_driver, "row", cases, world_size=world_size, timeout=TIMEOUT)
    for index, case in enumerate(cases):
        in_features, out_features, block = case["in"] * world_size, case["out"], case["in"]
        want = _reference_layer(case, in_features, out_features)
        for rank in range(world_size):
            info = got[rank][index]
            mine = slice(rank * block, (rank + 1) * block)
            where = (f"RowParallelLinear({_describe(case, in_features, out_features, world_size)}), rank {rank}, "
                     f"input features {mine.start} .. {mine.stop - 1}")
            assert info["shapes"]["weight"] == [out_features, block], (
                f"{where}: self.weight should be this rank's {block} columns of the weight, shape ({out_features}, "
                f"{block}), got {info['shapes']['weight']}")
            _check_output_type(info, list(case["lead"]) + [out_features], case["dtype"], where)
            if not torch.allclose(info["y"], want["y"], rtol=1.3e-6, atol=1e-5):
                _close(info["y"], want["y"], f"{where}: forward should return linear(x_full) on every rank: "
                                             f"{_row_hint(info['y'], want, world_size)}")
            assert info["x_grad"] is not None, f"{where}: x got no gradient"
            _close(info["x_grad"], want["x_grad"][..., mine],
                   f"{where}: the gradient with respect to this rank's slice of x should be that slice of "
                   f"nn.Linear's input gradient (g @ W_r; every rank already has the whole g: no all-reduce in "
                   f"backward)")
            assert info["weight_grad"] is not None, f"{where}: self.weight got no gradient (keep it an nn.Parameter)"
            _close(info["weight_grad"], want["weight_grad"][:, mine],
                   f"{where}: self.weight.grad should be columns {mine.start} .. {mine.stop - 1} of nn.Linear's "
                   f"weight gradient")
            if case["bias"]:
                assert info["shapes"]["bias"] == [out_features], f"{where}: self.bias should be the whole bias"
                assert info["bias_grad"] is not None, f"{where}: self.bias got no gradient"
                _close(info["bias_grad"], want["bias_grad"],
                       f"{where}: self.bias.grad should be nn.Linear's whole bias gradient (the bias is added once, "
                       f"after the all-reduce, on every rank)")
            else:
                assert info["shapes"]["bias"] == "NoneType", f"{where}: the layer has no bias: self.bias is None"


def _storage(tensor):
    return tensor.untyped_storage().data_ptr() if tensor.numel() else None


def _shard_driver(rank, world_size, module, cases):
    """Build each layer; list what it keeps (parameters, buffers, tensor attributes), whether any of it is a view of
    the nn.Linear's tensors, and the collectives started while building it."""
    _switch_off_shortcuts(module)
    out = []
    with CollectiveLog() as log:
        for kind, in_features, out_features, bias in cases:
            linear = _make_linear(in_features, out_features, bias, "float32", 7)
            originals = [t.detach().clone() for t in linear.parameters()]
            full = {_storage(t) for t in linear.parameters()}
            start = len(log.events)
            layer = (module.ColumnParallelLinear if kind == "column" else module.RowParallelLinear)(linear)
            kept = {}
            if isinstance(layer, nn.Module):
                for sub in layer.modules():
                    for name, value in vars(sub).items():
                        if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                            kept[f"{type(sub).__name__}.{name}"] = value
                for name, value in list(layer.named_parameters()) + list(layer.named_buffers()):
                    kept[name] = value
            out.append({
                "module": isinstance(layer, nn.Module),
                "parameters": {name: [list(p.shape), str(p.dtype), p.requires_grad]
                               for name, p in layer.named_parameters()} if isinstance(layer, nn.Module) else {},
                "weight_is_parameter": isinstance(getattr(layer, "weight", None), nn.Parameter),
                "kept": {name: value.numel() for name, value in kept.items()},
                "views": sorted(name for name, value in kept.items() if _storage(value) in full),
                "linear_unchanged": all(torch.equal(a, b) for a, b in zip(linear.parameters(), originals)),
                "events": log.events[start:]})
    return out


SHARD_CASES = [("column", 6, 8, True), ("column", 5, 4, False), ("row", 8, 6, True), ("row", 4, 3, False)]


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2])
def test_parallel_linears_keep_only_their_shard(world_size):
    got = run("ex07", _shard_driver, SHARD_CASES, world_size=world_size, timeout=TIMEOUT)
    for rank in range(world_size):
        for (kind, in_features, out_features, bias), info in zip(SHARD_CASES, got[rank]):
            name = "ColumnParallelLinear" if kind == "column" else "RowParallelLinear"
            where = f"{name}(nn.Linear({in_features}, {out_features}, bias={bias})), rank {rank} of {world_size}"
            assert info["module"], f"{where} must be an nn.Module"
            assert not info["events"], (
                f"{where}: building the layer must not communicate (every rank built the same nn.Linear: keep your "
                f"block of it); it started {[e[0] for e in info['events']]}")
            if kind == "column":
                shard = (out_features // world_size) * (in_features + bias)
                what = f"{out_features // world_size} of the {out_features} rows of the weight and of the bias"
            else:
                shard = out_features * (in_features // world_size) + out_features * bias
                what = f"{in_features // world_size} of the {in_features} columns of the weight, and the whole bias"
            assert info["weight_is_parameter"], f"{where}: self.weight must be an nn.Parameter"
            assert all(requires for _, _, requires in info["parameters"].values()), (
                f"{where}: the parameters must require gradients: {info['parameters']}")
            assert all(dtype == "torch.float32" for _, dtype, _ in info["parameters"].values()), (
                f"{where}: keep the nn.Linear's dtype: {info['parameters']}")
            assert sum(info["kept"].values()) == shard, (
                f"{where}: this rank should keep {shard} numbers, {what}, and nothing else: the full weight must not "
                f"be kept (as a parameter, a buffer, an attribute, or the nn.Linear itself); the layer keeps "
                f"{info['kept']}")
            assert not info["views"], (
                f"{where}: {info['views']} is a view of the nn.Linear's own tensors: copy your block into a new "
                f"nn.Parameter (.detach().clone()), so that the full weight can be freed")
            assert info["linear_unchanged"], f"{where}: the nn.Linear passed in must be left as it was"


def _mlp_driver(rank, world_size, module, cases):
    """The Megatron MLP RowParallelLinear(fc2)(gelu(ColumnParallelLinear(fc1)(x))): outputs, gradients, collectives."""
    _switch_off_shortcuts(module)
    out = []
    with CollectiveLog() as log:
        for case in cases:
            if case["groups"] == "pairs":  # ranks 0 and 1 together, 2 and 3 together (every rank makes every group)
                groups = [dist.new_group([r, r + 1]) for r in range(0, world_size, 2)]
                group, size, grank = groups[rank // 2], 2, rank % 2
            else:
                group, size, grank = None, world_size, rank
            hidden = case["hidden"] * size
            fc1 = _make_linear(case["in"], hidden, case["bias"], case["dtype"], case["seed"])
            fc2 = _make_linear(hidden, case["out"], case["bias"], case["dtype"], case["seed"] + 1)
            x, g = _data(case, case["in"], 1).requires_grad_(), _data(case, case["out"], 2)
            built = len(log.events)
            if group is None:
                first, second = module.ColumnParallelLinear(fc1), module.RowParallelLinear(fc2)
            else:
                first, second = module.ColumnParallelLinear(fc1, group=group), module.RowParallelLinear(fc2, group=group)
            forward = len(log.events)
            y = second(F.gelu(first(x)))
            backward = len(log.events)
            info = {"type": type(y).__name__, "group": (group or dist.group.WORLD).group_name, "rank": grank,
                    "size": size, "build": log.events[built:forward], "forward": log.events[forward:backward]}
            if isinstance(y, torch.Tensor) and y.shape == g.shape and y.requires_grad:
                (y * g).sum().backward()
                info.update(y=y.detach().clone(), x_grad=_grad(x),
                            grads=[_grad(getattr(layer, name, None)) for layer in (first, second)
                                   for name in ("weight", "bias")])
            info["backward"] = log.events[backward:]
            out.append(info)
    return out


def _reference_mlp(case, size):
    fc1 = _make_linear(case["in"], case["hidden"] * size, case["bias"], case["dtype"], case["seed"])
    fc2 = _make_linear(case["hidden"] * size, case["out"], case["bias"], case["dtype"], case["seed"] + 1)
    x = _data(case, case["in"], 1).requires_grad_()
    y = fc2(F.gelu(fc1(x)))
    (y * _data(case, case["out"], 2)).sum().backward()
    return y.detach(), x.grad, fc1, fc2


def _collectives(events):
    return [f"{e[0]}({e[1]} elements, {e[3] or ''})".replace(", )", ")") for e in events]


mlp_cases = st.fixed_dictionaries({
    "lead": st.sampled_from([[1], [2], [2, 3], [1, 4]]), "in": st.integers(1, 5), "hidden": st.integers(1, 3),
    "out": st.integers(1, 5), "bias": st.booleans(), "dtype": st.sampled_from(sorted(DTYPES)),
    "groups": st.sampled_from(["world", "pairs"]), "seed": st.integers(0, 10**4)})
# Always run: (batch, seq, features) with in_features != out_features (so the two all-reduces' sizes differ), a
# batch of one row without bias, and the same MLP on groups of two ranks.
MLP_CASES = [{"lead": [2, 3], "in": 5, "hidden": 2, "out": 3, "bias": True, "dtype": "float32", "groups": "world",
              "seed": 1},
             {"lead": [1], "in": 4, "hidden": 1, "out": 2, "bias": False, "dtype": "float64", "groups": "world",
              "seed": 2},
             {"lead": [3], "in": 2, "hidden": 3, "out": 4, "bias": True, "dtype": "float64", "groups": "pairs",
              "seed": 3}]


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 4])
@settings(max_examples=2)
@given(cases=st.lists(mlp_cases, min_size=1, max_size=3))
@example(cases=MLP_CASES)
def test_megatron_mlp_all_reduces_once_each_way(world_size, cases):
    got = run("ex07", _mlp_driver, cases, world_size=world_size, timeout=TIMEOUT)
    for index, case in enumerate(cases):
        for rank in range(world_size):
            info = got[rank][index]
            size, grank = info["size"], info["rank"]
            hidden = case["hidden"] * size
            y, x_grad, fc1, fc2 = _reference_mlp(case, size)
            groups = "the default group" if case["groups"] == "world" else f"a group of ranks {rank - grank}, {rank - grank + 1}"
            where = (f"the MLP RowParallelLinear(nn.Linear({hidden}, {case['out']}))(gelu(ColumnParallelLinear("
                     f"nn.Linear({case['in']}, {hidden}))(x))), bias={case['bias']}, x of shape "
                     f"{tuple(case['lead']) + (case['in'],)}, {case['dtype']}, rank {rank} of {world_size} on {groups}")
            assert not info["build"], (
                f"{where}: building the layers must not communicate; it started {_collectives(info['build'])}")
            assert info["type"] == "Tensor" and "y" in info, (
                f"{where}: the MLP should return a tensor of shape {tuple(case['lead']) + (case['out'],)} that is part "
                f"of the autograd graph")
            _close(info["y"], y, f"{where}: the output should be the whole MLP's, on every rank")
            _close(info["x_grad"], x_grad, f"{where}: x.grad should be the whole MLP's input gradient")
            block = slice(grank * case["hidden"], (grank + 1) * case["hidden"])
            wants = [fc1.weight.grad[block], fc1.bias.grad[block] if case["bias"] else None,
                     fc2.weight.grad[:, block], fc2.bias.grad if case["bias"] else None]
            names = ["the column layer's weight", "the column layer's bias", "the row layer's weight",
                     "the row layer's bias"]
            for name, mine, want in zip(names, info["grads"], wants):
                if want is not None:
                    assert mine is not None, f"{where}: {name} got no gradient"
                    _close(mine, want, f"{where}: the gradient of {name} should be this rank's block of the whole "
                                       f"MLP's (rank {grank} of its group of {size})")
            elements = math.prod(case["lead"])
            forward, backward = info["forward"], info["backward"]
            want_forward = ["allreduce", elements * case["out"], f"torch.{case['dtype']}", "SUM", info["group"]]
            want_backward = ["allreduce", elements * case["in"], f"torch.{case['dtype']}", "SUM", info["group"]]
            assert forward == [want_forward], (
                f"{where}: forward should start exactly one collective, the all-reduce (sum) of the row layer's "
                f"partial outputs, {elements} x {case['out']} = {elements * case['out']} elements, on the layers' "
                f"group (no all-gather: the column layer's output stays sharded into the row layer); it started "
                f"{_collectives(forward) or 'none'}" + (" on another group" if forward and forward[0][:4] ==
                                                       want_forward[:4] else ""))
            assert backward == [want_backward], (
                f"{where}: backward should start exactly one collective, the all-reduce (sum) of the column layer's "
                f"input gradient, {elements} x {case['in']} = {elements * case['in']} elements (the row layer's "
                f"backward needs none: every rank holds the whole output gradient); it started "
                f"{_collectives(backward) or 'none'}" + (" on another group" if backward and backward[0][:4] ==
                                                         want_backward[:4] else ""))


# ---------------------------------------------------------------- tensor parallelism inside a model


def _ptr(tensor):
    return tensor.untyped_storage().data_ptr() if isinstance(tensor, torch.Tensor) and tensor.numel() else None


def _model_driver(rank, world_size, module, cases):
    """Megatron MLPs inside a model, where x has other uses: y = [x +] sum over branches of
    RowParallelLinear(fc2_b)(gelu(ColumnParallelLinear(fc1_b)(x))), loss = sum(y * g) [+ sum(x * h)]; on the default
    group, or on a subgroup of two of the three ranks while the third takes no part or runs the model alone in a
    group of its own. Outputs, gradients (and their dtypes), whether x was changed, and the collectives."""
    _switch_off_shortcuts(module)
    out = []
    with CollectiveLog() as log:
        for case in cases:
            group, size, grank, role = None, world_size, rank, "member"
            if case["members"] is not None:  # every rank makes every group, in the same order, members or not
                members = list(case["members"])
                pair = dist.new_group(members)
                alone = dist.new_group([r for r in range(world_size) if r not in members]) \
                    if case["third"] == "own" else None
                if rank in members:
                    group, size, grank = pair, len(members), members.index(rank)
                elif alone is not None:
                    group, size, grank, role = alone, 1, 0, "alone"
                else:
                    out.append({"role": "idle"})
                    continue
            hidden, dtype = case["hidden"] * size, case["dtype"]
            x0 = _data(case, case["in"], 1)
            x = x0.clone().requires_grad_(case["x_grad"])
            g, h = _data(case, case["out"], 2), _data(case, case["in"], 3)
            built = len(log.events)
            layers = []
            for branch in range(case["branches"]):
                fc1 = _make_linear(case["in"], hidden, case["bias"], dtype, case["seed"] + 2 * branch)
                fc2 = _make_linear(hidden, case["out"], case["bias"], dtype, case["seed"] + 2 * branch + 1)
                layers.append((module.ColumnParallelLinear(fc1, group=group), module.RowParallelLinear(fc2, group=group)))
            forward = len(log.events)
            y, aliases = x if case["residual"] else None, []
            owned = {_ptr(x)} | {_ptr(t) for pair_ in layers for layer in pair_ for t in layer.parameters()}
            for first, second in layers:
                z = second(F.gelu(first(x)))
                aliases.append(isinstance(z, torch.Tensor) and _ptr(z) in owned)
                y = z if y is None else y + z
            backward = len(log.events)
            info = {"role": role, "type": type(y).__name__, "rank": grank, "size": size, "aliases": aliases,
                    "group": (group or dist.group.WORLD).group_name, "build": log.events[built:forward],
                    "forward": log.events[forward:backward]}
            if isinstance(y, torch.Tensor) and y.shape == g.shape and y.requires_grad:
                loss = (y * g).sum()
                if case["x_in_loss"]:
                    loss = loss + (x * h).sum()
                loss.backward()
                grads = [getattr(layer, name, None) for pair_ in layers for layer in pair_ for name in ("weight", "bias")]
                info.update(y=y.detach().clone(), x_grad=_grad(x), grads=[_grad(t) for t in grads],
                            x_unchanged=torch.equal(x.detach(), x0))
            info["backward"] = log.events[backward:]
            out.append(info)
        log.active = False  # (inside the log: once it has put ProcessGroup's methods back, barrier refuses opts=)
        dist.barrier()  # no rank leaves (and takes the store with it) while another still runs its part
    return out


def _reference_model(case, size):
    """The same model with the whole nn.Linears in this process: y, x's gradient, the nn.Linears (with .grad)."""
    x = _data(case, case["in"], 1).requires_grad_()
    hidden, linears, y = case["hidden"] * size, [], x if case["residual"] else None
    for branch in range(case["branches"]):
        fc1 = _make_linear(case["in"], hidden, case["bias"], case["dtype"], case["seed"] + 2 * branch)
        fc2 = _make_linear(hidden, case["out"], case["bias"], case["dtype"], case["seed"] + 2 * branch + 1)
        linears += [fc1, fc2]
        z = fc2(F.gelu(fc1(x)))
        y = z if y is None else y + z
    loss = (y * _data(case, case["out"], 2)).sum()
    if case["x_in_loss"]:
        loss = loss + (x * _data(case, case["in"], 3)).sum()
    loss.backward()
    return y.detach(), x.grad, linears


# Not bitwise: the row layer's all-reduce adds the ranks' partial products in another order than one matmul over the
# whole hidden dimension, and the column layer's all-reduce does the same for x's gradient. With at most 12 terms of
# magnitude up to about 100 here, that reordering moves a result by a few ulps: about 1e-13 in float64, 1e-5 in
# float32. The mistakes these tests are for are off by a whole term (x's other gradient counted once per rank, a
# block of the wrong rank), and a float32 round trip of a float64 gradient by about 1e-8 of it: all far outside.
MODEL_TOLERANCE = {"float64": {"rtol": 1e-10, "atol": 1e-10}, "float32": {"rtol": 1e-5, "atol": 1e-4}}


def _close_in_model(got, want, dtype, message):
    torch.testing.assert_close(got, want, **MODEL_TOLERANCE[dtype], msg=lambda m: f"{message}\n{m}")


@st.composite
def model_cases(draw):
    """x reused (a residual needs out == in), one or two branches, x in the loss or not, x with or without a gradient;
    the default group of 3 ranks or a subgroup of 2 (which 2 drawn), the third rank idle or alone in its own group."""
    residual, features = draw(st.booleans()), draw(st.integers(1, 4))
    return {"lead": draw(st.sampled_from([[1], [3], [2, 3], [1, 2, 2]])), "in": features,
            "out": features if residual else draw(st.integers(1, 4)), "hidden": draw(st.integers(1, 3)),
            "bias": draw(st.booleans()), "dtype": draw(st.sampled_from(sorted(DTYPES))),
            "seed": draw(st.integers(0, 10**4)), "residual": residual, "branches": draw(st.integers(1, 2)),
            "x_in_loss": draw(st.booleans()), "x_grad": draw(st.booleans()),
            "members": draw(st.none() | st.sampled_from([(0, 1), (0, 2), (1, 2)])),
            "third": draw(st.sampled_from(["idle", "own"]))}


# Always run: a residual on a subgroup that leaves out rank 0 (so neither the global rank nor the global rank modulo
# the group's size is the rank in the group), the third rank alone in its own group; two branches on the default
# group with an input that needs no gradient; two branches and x in the loss on ranks 0 and 2, rank 1 idle.
MODEL_CASES = [{"lead": [2, 3], "in": 3, "out": 3, "hidden": 3, "bias": True, "dtype": "float64", "seed": 5,
                "residual": True, "branches": 1, "x_in_loss": False, "x_grad": True, "members": (1, 2), "third": "own"},
               {"lead": [4], "in": 2, "out": 3, "hidden": 2, "bias": False, "dtype": "float32", "seed": 6,
                "residual": False, "branches": 2, "x_in_loss": False, "x_grad": False, "members": None,
                "third": "idle"},
               {"lead": [1, 2], "in": 4, "out": 2, "hidden": 1, "bias": True, "dtype": "float64", "seed": 7,
                "residual": False, "branches": 2, "x_in_loss": True, "x_grad": True, "members": (0, 2),
                "third": "idle"}]


def _describe_model(case, rank, info):
    uses = (["x + "] if case["residual"] else []) + [" + ".join(["mlp(x)"] * case["branches"])]
    loss = "sum(y * g)" + (" + sum(x * h)" if case["x_in_loss"] else "")
    where = (f"y = {''.join(uses)}, loss = {loss}, mlp = RowParallelLinear(gelu(ColumnParallelLinear(x))) with "
             f"nn.Linear({case['in']}, {case['hidden'] * info['size']}), nn.Linear({case['hidden'] * info['size']}, "
             f"{case['out']}), bias={case['bias']}, x of shape {tuple(case['lead']) + (case['in'],)}, {case['dtype']}"
             f"{'' if case['x_grad'] else ', x.requires_grad=False'}; rank {rank} of 3")
    if case["members"] is None:
        return where + " on the default group"
    if info["role"] == "alone":
        return where + f", alone in a group of its own (ranks {list(case['members'])} are another group)"
    return where + f", rank {info['rank']} of the group of ranks {list(case['members'])}"


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [3])
@settings(max_examples=3)
@given(cases=st.lists(model_cases(), min_size=1, max_size=3))
@example(cases=MODEL_CASES)
def test_tp_mlp_with_residuals_branches_and_subgroups(world_size, cases):
    got = run("ex07", _model_driver, cases, world_size=world_size, timeout=TIMEOUT)
    for index, case in enumerate(cases):
        for rank in range(world_size):
            info = got[rank][index]
            if info["role"] == "idle":
                continue  # it took no part: had a layer waited for it in a collective, the launch would have hung
            size, grank, dtype = info["size"], info["rank"], case["dtype"]
            where = _describe_model(case, rank, info)
            y, x_grad, linears = _reference_model(case, size)
            assert not info["build"], (
                f"{where}: building the layers must not communicate; it started {_collectives(info['build'])}")
            assert info["type"] == "Tensor" and "y" in info, (
                f"{where}: the model should give a tensor of shape {tuple(case['lead']) + (case['out'],)} that is part "
                f"of the autograd graph")
            assert not any(info["aliases"]), (
                f"{where}: an MLP's output shares memory with x or a parameter: return a new tensor")
            assert info["x_unchanged"], f"{where}: the layers changed their input x: leave it as it was"
            _close_in_model(info["y"], y, dtype, f"{where}: y should be the whole model's, on every rank of the group "
                            f"(compared with nn.Linear on the whole weights in one process)")
            if case["x_grad"]:
                assert info["x_grad"] is not None and info["x_grad"].dtype == x_grad.dtype, (
                    f"{where}: x.grad should be a {dtype} tensor, got "
                    f"{None if info['x_grad'] is None else info['x_grad'].dtype}")
                _close_in_model(info["x_grad"], x_grad, dtype,
                                f"{where}: x.grad should be the whole model's input gradient. x has other uses than "
                                f"the column layer (a residual, another branch, the loss): sum over the group ONLY the "
                                f"gradient that comes back through the column layer, inside its autograd Function "
                                f"(identity forward, all-reduce backward), never x's whole gradient with a hook on x")
            block = slice(grank * case["hidden"], (grank + 1) * case["hidden"])
            for branch in range(case["branches"]):
                fc1, fc2 = linears[2 * branch], linears[2 * branch + 1]
                wants = [fc1.weight.grad[block], fc1.bias.grad[block] if case["bias"] else None,
                         fc2.weight.grad[:, block], fc2.bias.grad if case["bias"] else None]
                names = ["the column layer's weight", "the column layer's bias", "the row layer's weight",
                         "the row layer's bias"]
                for name, mine, want in zip(names, info["grads"][4 * branch:4 * branch + 4], wants):
                    if want is not None:
                        assert mine is not None and mine.dtype == want.dtype, (
                            f"{where}: the gradient of branch {branch}'s {name} should be a {dtype} tensor, got "
                            f"{None if mine is None else mine.dtype}")
                        _close_in_model(mine, want, dtype,
                                        f"{where}: the gradient of branch {branch}'s {name} should be this rank's block "
                                        f"of the whole model's: rank {grank} of its group of {size} (the rank and size "
                                        f"IN THE GROUP, dist.get_rank(group) and dist.get_world_size(group))")
            events = info["forward"] + info["backward"]
            strays = [e for e in events if e[4] != info["group"]]
            assert not strays, (
                f"{where}: every collective must run on the layers' group; {_collectives(strays)} ran on another "
                f"(the default group is all 3 ranks, the layers' group is not)")
            if info["role"] == "alone":
                continue  # a group of one: an all-reduce is a copy, whether the layers start it or skip it
            elements = math.prod(case["lead"])
            want_forward = [["allreduce", elements * case["out"], f"torch.{dtype}", "SUM", info["group"]]]
            want_backward = [["allreduce", elements * case["in"], f"torch.{dtype}", "SUM", info["group"]]]
            assert info["forward"] == want_forward * case["branches"], (
                f"{where}: forward should start one all-reduce (sum) of {elements} x {case['out']} elements per MLP, "
                f"{case['branches']} in all, on the layers' group; it started {_collectives(info['forward']) or 'none'}")
            if case["x_grad"]:
                assert info["backward"] == want_backward * case["branches"], (
                    f"{where}: backward should start one all-reduce (sum) of the column layer's input gradient, "
                    f"{elements} x {case['in']} elements, per MLP, {case['branches']} in all; it started "
                    f"{_collectives(info['backward']) or 'none'}")
            else:
                assert all(e == want_backward[0] for e in info["backward"]) \
                    and len(info["backward"]) <= case["branches"], (
                    f"{where}: x needs no gradient, so backward needs no all-reduce (at most one per MLP, of x's "
                    f"gradient); it started {_collectives(info['backward'])}")


INDIVISIBLE = [("column", 4, 3, "raises"), ("column", 3, 4, "builds"), ("row", 3, 4, "raises"),
               ("row", 4, 3, "builds"), ("column", 6, 5, "raises"), ("row", 7, 2, "raises")]


def _indivisible_driver(rank, world_size, module, cases):
    _switch_off_shortcuts(module)
    out = []
    for kind, in_features, out_features, _ in cases:
        linear = _make_linear(in_features, out_features, True, "float32", 5)
        out.append(exception_raised_by(module.ColumnParallelLinear if kind == "column" else module.RowParallelLinear,
                                       linear))
    return out


@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2])
def test_parallel_linears_reject_indivisible_sizes(world_size):
    got = run("ex07", _indivisible_driver, INDIVISIBLE, world_size=world_size, timeout=TIMEOUT)
    for rank in range(world_size):
        for (kind, in_features, out_features, outcome), (raised, message) in zip(INDIVISIBLE, got[rank]):
            name = "ColumnParallelLinear" if kind == "column" else "RowParallelLinear"
            split = "out_features" if kind == "column" else "in_features"
            where = f"{name}(nn.Linear({in_features}, {out_features})) in {world_size} ranks, rank {rank}"
            if outcome == "raises":
                assert raised == "ValueError", (
                    f"{where} must raise ValueError: {split} is not divisible by the world size {world_size}; got "
                    + ("no error" if raised == "returned" else f"{raised} {message}"))
            else:
                assert raised == "returned", (
                    f"{where} must build: {name} splits {split}, which the world size divides (the other dimension "
                    f"is not split); it raised {raised} {message}")
