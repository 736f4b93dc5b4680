"""Graded tests for exercise 09 (notebooks/09_putting_it_together.ipynb).

References are computed here, in the test process, without the learner's code: ring attention by plain softmax
attention over the whole sequence, in float64, on the same (rounded) inputs the ranks got; expert-parallel dispatch
and combine by a single-process mixture of experts that loops over every rank's tokens in order, keeps each
expert's first `capacity` assignments per rank and applies the experts as plain weight matrices; the memory of a
layout by building the Llama-style model on the meta device and adding up the elements of the slice each GPU holds
(torch.chunk of every weight as tensor parallelism, then FSDP cut it), checked against the Llama 3 8B parameter
count, and once against FSDP2 itself (fully_shard on 2 gloo ranks: the padded shard each rank allocates).

Generated inputs (Hypothesis): for ring attention, 1 to 4 ranks, batch 1 to 2, 1 to 3 heads, head_dim 1 to 6,
chunks of 1 to 4 positions per rank, float32, bfloat16 or float64, causal or not, q, k and v laid out as
(batch, heads, seq, dim) or as transposed views of a (batch, seq, heads, dim) buffer, and logits scaled up to the
hundreds (where exp overflows without the running max); for the mixture of experts, 1 to 4 ranks, 0 to 5 tokens
per rank (different on each rank), widths 1 to 4, 1 or 2 experts per rank, top-1 or top-2 routing, uniform or
skewed to expert 0, capacities from 0 (everything dropped) to more than every token, float32 or float64; for the
memory, models whose sizes the degrees divide, FSDP 1 to 8, TP 1, 2 or 4, PP 1 to 4, every stage, each count typed
as an int, an integral float or a numpy integer.

The distributed pieces run in gloo ranks. Inside a rank every message and collective is logged where every
torch.distributed function passes (the process group's methods: kind, elements, dtype, and the peer of a send or a
receive), so the tests check HOW the pieces talk: ring attention sends only to the next rank and receives only from
the previous one, exactly n - 1 passes of one k and one v chunk in the inputs' dtype, and nothing else; it waits
for every receive (Work.wait() counted); it folds a block (an exp) only after posting the pass that moves it on (the
transfer overlaps the computation), and (a TorchDispatchMode watching every op it runs) never makes a tensor of more
than two blocks (no rank holds the whole sequence's keys); dispatch runs exactly two all_to_all_singles (the counts,
then only the kept tokens) and combine one, and the tokens arrive in the stated order (one fixed MoE case routes 9
to 14 tokens per rank, top-2: torch's unstable sort reorders 17 equal keys or more). Also: the inputs are left
unchanged, the results are new tensors of the right shape and dtype, and bad arguments raise a ValueError that
names the argument to fix before any other.
While the learner's code runs, torch's context parallelism, the lesson's own models (course_lib.models) and planner
(course_lib.parallel.planner, course_lib.parallel.compose) refuse to run.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from course_lib.grading import exception_raised_by, run
from course_lib.grading.audits import assert_rejects
from course_lib.grading.collective_log import CollectiveLog
from course_lib.grading.shortcuts import defined_in, lesson_module_switch, refuser_for, replace, switch_off_shortcuts

TIMEOUT = 60  # s: a rank waiting in a collective its peers never start hangs; fail it in time


# ---------------------------------------------------------------- shortcuts switched off in the child

# course_lib.parallel's modules of lessons 02-08 stay allowed; lesson 09's (compose, planner) refuse
LESSON_MODULES = ("streams", "data_parallel", "links", "ddp", "ddp_pictures", "pipeline", "tensor_parallel",
                  "sharding")
CONTEXT_PARALLEL = ("torch.distributed.tensor.experimental._context_parallel",
                    "torch.distributed.tensor.experimental._attention")

_refuser = refuser_for("09", "dist.isend and dist.irecv around the ring with the online softmax; "
                             "dist.all_to_all_single for the experts; plain arithmetic for the memory")


def _switch_off_everything(module, replaced):
    """Every function and class the module defines refuses (torch's context parallelism, the lesson's models)."""
    for name, _ in defined_in(module):
        replace(module, name, _refuser(f"{module.__name__}.{name}"), replaced)


def _switch_off_experimental(module, replaced):
    """torch.distributed.tensor.experimental re-exports context_parallel: that name refuses too."""
    for name in ("context_parallel", "context_parallel_unshard"):
        if callable(getattr(module, name, None)):
            replace(module, name, _refuser(f"torch's {name}"), replaced)


def _switcher(fullname):
    """Which switch applies to the module of this name, or None."""
    if any(fullname == prefix or fullname.startswith(prefix + ".") for prefix in CONTEXT_PARALLEL):
        return _switch_off_everything
    if fullname == "torch.distributed.tensor.experimental":
        return _switch_off_experimental
    if fullname == "course_lib.models" or fullname.startswith("course_lib.models."):
        return _switch_off_everything
    return lesson_module_switch(fullname, LESSON_MODULES, _refuser)


def _switch_off_shortcuts(learner):
    """In the child: the shortcuts refuse to run (course_lib.grading.shortcuts)."""
    switch_off_shortcuts(learner, _switcher, _refuser)


# ---------------------------------------------------------------- the messages a rank sends

def _assert_names_first(where, message, broken, names):
    """The first of the arguments' names that the message mentions (as a word) is the one to fix."""
    import re

    found = sorted((m.start(), name) for name in names for m in [re.search(rf"(?<!\w){name}\b", message)] if m)
    assert found and found[0][1] == broken, (
        f"{where}: the ValueError should name the argument to fix, {broken}, before any other; it says {message!r}")


def _kinds(events):
    return [f"{e[0]}({e[1]} elements, {e[2]}{', peer ' + str(e[5]) if len(e) > 5 else ''})" for e in events]


def _dtype_name(value):
    return str(value.dtype).removeprefix("torch.") if isinstance(value, torch.Tensor) else type(value).__name__


# ---------------------------------------------------------------- ring attention

def _qkv(case, world_size):
    """The whole sequence's q, k and v, (batch, heads, world_size * chunk, head_dim) in the case's dtype, from its
    seed; q and k scaled by case["scale"] (30: logits in the hundreds)."""
    generator = torch.Generator().manual_seed(case["seed"])
    shape = (case["batch"], case["heads"], world_size * case["chunk"], case["head_dim"])
    q, k, v = (torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(3))
    dtype = getattr(torch, case["dtype"])
    return (q * case["scale"]).to(dtype), (k * case["scale"]).to(dtype), v.to(dtype)


def _chunk_of(tensor, rank, case):
    """Rank `rank`'s chunk of positions, as its own tensor: contiguous, or (layout "bshd") the same values as a
    transposed view of a (batch, seq, heads, dim) buffer, the layout a model's projections give."""
    chunk = tensor[:, :, rank * case["chunk"]:(rank + 1) * case["chunk"]]
    if case["layout"] == "bshd":
        return chunk.transpose(1, 2).contiguous().transpose(1, 2)
    return chunk.contiguous()


def _attention_reference(q, k, v, causal):
    """softmax(q kᵀ / √head_dim + mask) v over the whole sequence, in float64; and the largest |score|."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    largest = scores.abs().max().item() if scores.numel() else 0.0
    if causal:
        positions = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(positions, positions, dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(scores, dim=-1) @ v, largest


def _describe_ring(case, world_size):
    return (f"ring_attention over {world_size} rank(s), q, k, v of ({case['batch']}, {case['heads']}, "
            f"{case['chunk']}, {case['head_dim']}) per rank ({world_size * case['chunk']} positions in all), "
            f"{case['dtype']}, causal={case['causal']}, layout {case['layout']}"
            + (f", logits scaled by {case['scale'] ** 2}" if case["scale"] != 1 else ""))


def _ring_driver(rank, world_size, module, cases):
    _switch_off_shortcuts(module)
    out = []
    for case in cases:
        q, k, v = (_chunk_of(t, rank, case) for t in _qkv(case, world_size))
        result = module.ring_attention(q, k, v, causal=case["causal"])
        out.append(result.detach().clone() if isinstance(result, torch.Tensor) else repr(type(result)))
    return out


def _check_ring_values(got, cases, world_size):
    for index, case in enumerate(cases):
        q, k, v = _qkv(case, world_size)
        want, largest = _attention_reference(q, k, v, case["causal"])
        # An error δ in a score moves its weight by a factor e^δ: the scores, computed in float32 (float64 for float64
        # inputs), carry a relative rounding error of a few ulps of the largest |score|. bfloat16 results are
        # rounded once more, to 8 significant bits: a relative error of at most 2**-9, 2**-8 allowed.
        eps = torch.finfo(torch.float64 if case["dtype"] == "float64" else torch.float32).eps
        atol = 8 * eps * (1 + largest) * max(1.0, v.double().abs().max().item()) + 1e-12
        rtol = 2.0**-8 if case["dtype"] == "bfloat16" else 0.0
        for rank in range(world_size):
            result = got[rank][index]
            where = f"{_describe_ring(case, world_size)}, rank {rank}"
            assert isinstance(result, torch.Tensor), f"{where}: ring_attention should return a tensor, got {result}"
            mine = slice(rank * case["chunk"], (rank + 1) * case["chunk"])
            assert tuple(result.shape) == tuple(want[:, :, mine].shape), (
                f"{where}: the result should be shaped like this rank's q, {tuple(want[:, :, mine].shape)}; it is "
                f"{tuple(result.shape)}")
            assert result.dtype == getattr(torch, case["dtype"]), (
                f"{where}: the result should have the inputs' dtype, {case['dtype']} (accumulate in float32, round "
                f"once at the end); it is {_dtype_name(result)}")
            torch.testing.assert_close(result.double(), want[:, :, mine], rtol=rtol, atol=atol, msg=lambda m: (
                f"{where}: this rank's rows (positions {mine.start}..{mine.stop - 1}) differ from softmax attention "
                f"over the whole sequence (each block folded in with the running max m and normaliser l: rescale "
                f"the old output and l by e^(m - m') whenever the max grows; under causal the own block is masked "
                f"above its diagonal, earlier ranks' blocks are seen whole, later ones not at all)\n{m}"))


ring_cases = st.fixed_dictionaries({
    "batch": st.integers(1, 2), "heads": st.integers(1, 3), "head_dim": st.integers(1, 6), "chunk": st.integers(1, 4),
    "dtype": st.sampled_from(["float32", "bfloat16", "float64"]), "causal": st.booleans(),
    "layout": st.sampled_from(["bhsd", "bshd"]), "scale": st.sampled_from([1.0, 1.0, 30.0]),
    "seed": st.integers(0, 10**4)})
# Always run: causal and not, each dtype, the transposed layout, a chunk of one position, logits of ~1000 in
# bfloat16 and float32 (exp(1000) overflows float32 and float64 both: the running max must come first).
RING_CASES = [
    {"batch": 2, "heads": 2, "head_dim": 4, "chunk": 3, "dtype": "float32", "causal": True, "layout": "bhsd",
     "scale": 1.0, "seed": 1},
    {"batch": 1, "heads": 3, "head_dim": 5, "chunk": 2, "dtype": "float64", "causal": False, "layout": "bshd",
     "scale": 1.0, "seed": 2},
    {"batch": 1, "heads": 2, "head_dim": 3, "chunk": 4, "dtype": "bfloat16", "causal": True, "layout": "bshd",
     "scale": 1.0, "seed": 3},
    {"batch": 2, "heads": 1, "head_dim": 6, "chunk": 1, "dtype": "float32", "causal": False, "layout": "bhsd",
     "scale": 1.0, "seed": 4},
    {"batch": 1, "heads": 2, "head_dim": 4, "chunk": 2, "dtype": "bfloat16", "causal": False, "layout": "bhsd",
     "scale": 30.0, "seed": 5},
    {"batch": 1, "heads": 1, "head_dim": 2, "chunk": 3, "dtype": "float32", "causal": True, "layout": "bhsd",
     "scale": 30.0, "seed": 6}]


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@settings(max_examples=1)
@given(cases=st.lists(ring_cases, min_size=1, max_size=4))
@example(cases=RING_CASES)
def test_ring_attention_matches_full_attention(world_size, cases):
    got = run("ex09", _ring_driver, cases, world_size=world_size, timeout=TIMEOUT)
    _check_ring_values(got, cases, world_size)


FOLDS = ("exp", "exp_", "exp2", "exp2_", "softmax", "_softmax", "_safe_softmax", "logsumexp")


def _is_fold(func):
    """An op that folds a block in: the online softmax's exponential (or a softmax or attention kernel)."""
    name = str(getattr(func, "overloadpacket", func)).rpartition(".")[2]
    return name in FOLDS or "scaled_dot_product" in name


class _CountWaits:
    """Inside a rank: counts the calls of Work.wait() (what dist.isend, dist.irecv and batch_isend_irecv return)."""

    def __enter__(self):
        from torch._C._distributed_c10d import Work

        self.calls, self._saved = 0, Work.__dict__["wait"]
        original, counter = Work.wait, self

        def wait(work, *args, **kwargs):
            counter.calls += 1
            return original(work, *args, **kwargs)

        Work.wait = wait
        return self

    def __exit__(self, *exc):
        from torch._C._distributed_c10d import Work

        Work.wait = self._saved
        return False


def _ring_audit_driver(rank, world_size, module, cases):
    """Per case: the messages and collectives ring_attention started, where its folds (exps) fell among them, the
    waits, the largest floating tensor an op made, the inputs after the call, and whether the result shares their
    memory."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    _switch_off_shortcuts(module)
    out = []
    with CollectiveLog() as log, _CountWaits() as waits:
        for case in cases:
            q, k, v = (_chunk_of(t, rank, case) for t in _qkv(case, world_size))
            kept = [t.clone() for t in (q, k, v)]
            strides = [t.stride() for t in (q, k, v)]
            folds, largest = [], [0, ""]

            class Watch(TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    result = func(*args, **(kwargs or {}))
                    if _is_fold(func):
                        folds.append(len(log.events) - start)
                    for value in tree_leaves(result):
                        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() > largest[0]:
                            largest[:] = [value.numel(), f"{func} of shape {list(value.shape)}"]
                    return result

            start, waited = len(log.events), waits.calls
            with Watch():
                result = module.ring_attention(q, k, v, causal=case["causal"])
            inputs = {t.untyped_storage().data_ptr() for t in (q, k, v)}
            out.append({"events": log.events[start:], "folds": folds, "largest": largest,
                        "waits": waits.calls - waited,
                        "unchanged": [torch.equal(a, b) for a, b in zip((q, k, v), kept)],
                        "strides": [t.stride() for t in (q, k, v)] == strides,
                        "aliased": isinstance(result, torch.Tensor) and (result.untyped_storage().data_ptr() in inputs),
                        "type": type(result).__name__})
    return out


# head_dim = chunk: one block of k, of v, of scores or of the output holds batch x heads x chunk x chunk elements
AUDIT_CASES = [
    {"batch": 1, "heads": 2, "head_dim": 4, "chunk": 4, "dtype": "float32", "causal": False, "layout": "bhsd",
     "scale": 1.0, "seed": 7},
    {"batch": 1, "heads": 2, "head_dim": 4, "chunk": 4, "dtype": "bfloat16", "causal": True, "layout": "bshd",
     "scale": 1.0, "seed": 8}]


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_attention_passes_blocks_around_the_ring(world_size):
    got = run("ex09", _ring_audit_driver, AUDIT_CASES, world_size=world_size, timeout=TIMEOUT)
    for index, case in enumerate(AUDIT_CASES):
        block = case["batch"] * case["heads"] * case["chunk"] * case["head_dim"]
        for rank in range(world_size):
            info = got[rank][index]
            where = f"{_describe_ring(case, world_size)}, rank {rank}"
            events = info["events"]
            other = [e for e in events if e[0] not in ("send", "recv")]
            assert not other, (
                f"{where}: ring attention only passes blocks to a neighbour (dist.isend / dist.irecv); it started "
                f"{_kinds(other)}")
            sends = [e for e in events if e[0] == "send"]
            receives = [e for e in events if e[0] == "recv"]
            nxt, previous = (rank + 1) % world_size, (rank - 1) % world_size
            assert all(e[5] == nxt for e in sends) and all(e[5] == previous for e in receives), (
                f"{where}: send only to the next rank ({nxt}) and receive only from the previous one ({previous}); "
                f"the messages were {_kinds(sends + receives)}")
            expected = [block] * (2 * (world_size - 1))
            assert [e[1] for e in sends] == expected and [e[1] for e in receives] == expected, (
                f"{where}: {world_size - 1} pass(es) around the ring, each sending one k chunk and one v chunk "
                f"({block} elements each) and receiving the next two: {len(expected)} sends and receives of "
                f"{block} elements each; it sent {_kinds(sends)} and received {_kinds(receives)}")
            assert info["waits"] >= len(receives), (
                f"{where}: wait for every receive (work.wait() on what dist.irecv or batch_isend_irecv returned) "
                f"before computing with the block it fills: {len(receives)} receives, {info['waits']} waits")
            dtypes = {e[2] for e in sends}
            assert dtypes <= {f"torch.{case['dtype']}"}, (
                f"{where}: send the blocks in the inputs' dtype ({case['dtype']}): casting to float32 first doubles "
                f"the bytes on the wire; it sent {sorted(dtypes)}")
            most = 2 * case["batch"] * case["heads"] * case["chunk"] * max(case["chunk"], case["head_dim"])
            if world_size >= 3:
                assert info["largest"][0] <= most, (
                    f"{where}: a rank computes with one block at a time and never holds the whole sequence's keys, "
                    f"values or scores: no tensor should hold more than two blocks ({most} elements); "
                    f"{info['largest'][1]} holds {info['largest'][0]}")
            if not case["causal"]:
                p2p = [i for i, e in enumerate(events) if e[0] in ("send", "recv")]
                starts = p2p[::4] + [len(events)]
                early = [f for f in info["folds"] if f <= starts[0]]
                idle = [p for p in range(world_size - 1) if not any(starts[p] < f <= starts[p + 1]
                                                                       for f in info["folds"])]
                assert not early and not idle, (
                    f"{where}: post each pass's sends and receives before folding in the block you hold, and wait "
                    f"for them after, so the next block travels while this one is computed: "
                    + ("a block was folded in (an exp) before the first pass was posted" if early else
                       f"no block was folded in while pass(es) {idle} travelled"))


@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2])
def test_ring_attention_leaves_its_inputs_alone(world_size):
    got = run("ex09", _ring_audit_driver, AUDIT_CASES, world_size=world_size, timeout=TIMEOUT)
    for index, case in enumerate(AUDIT_CASES):
        for rank in range(world_size):
            info = got[rank][index]
            where = f"{_describe_ring(case, world_size)}, rank {rank}"
            assert info["type"] == "Tensor", f"{where}: ring_attention should return a torch.Tensor, got {info['type']}"
            changed = [name for name, same in zip("qkv", info["unchanged"]) if not same]
            assert not changed and info["strides"], (
                f"{where}: ring_attention must leave its inputs as they were; it changed {changed or 'their strides'}")
            assert not info["aliased"], f"{where}: the result should be a new tensor, not a view of q, k or v"


def _bad_ring_calls():
    """(q, k, v), the argument to name. Last, the one an unchecked ring fails in the middle of: a rank that raises
    between posting a pass and waiting for it leaves messages behind that the next call would receive."""
    good = torch.zeros(1, 2, 3, 4)
    return [((good[0], good[0], good[0]), "q"), (([[0.0]], good, good), "q"),
            ((good, good, torch.zeros(1, 2, 3, 5)), "v"), ((good, good.double(), good), "k"),
            ((good, good, good.bfloat16()), "v"), ((good.long(), good.long(), good.long()), "q"),
            ((good, torch.zeros(1, 2, 2, 4), good), "k")]


def _bad_ring_driver(rank, world_size, module):
    _switch_off_shortcuts(module)
    return [exception_raised_by(module.ring_attention, *args) for args, _ in _bad_ring_calls()]


@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2])
def test_ring_attention_rejects_bad_inputs(world_size):
    got = run("ex09", _bad_ring_driver, world_size=world_size, timeout=TIMEOUT)
    for rank in range(world_size):
        for (args, broken), (raised, message) in zip(_bad_ring_calls(), got[rank]):
            shapes = ", ".join(f"{tuple(a.shape)} {_dtype_name(a)}" if isinstance(a, torch.Tensor) else repr(a)
                               for a in args)
            where = f"ring_attention({shapes}) on rank {rank}"
            assert_rejects(where, raised, message, broken)
            _assert_names_first(where, message, broken, ("q", "k", "v"))


# ---------------------------------------------------------------- expert parallelism

def _moe_sizes(case, world_size):
    """(experts in all, top-k, tokens on each rank)."""
    experts = case["per_rank"] * world_size
    return experts, min(case["k"], experts), case["tokens"][:world_size]


def _moe_inputs(case, world_size, rank):
    """Rank `rank`'s tokens (T, dim), its top-k expert ids (T, k) (distinct per token; skewed: expert 0 drawn 8
    times as often), and gates (T, k) float32 summing to 1 per token."""
    experts, k, tokens = _moe_sizes(case, world_size)
    generator = torch.Generator().manual_seed(1000 * case["seed"] + rank)
    dtype = getattr(torch, case["dtype"])
    x = torch.randn(tokens[rank], case["dim"], generator=generator, dtype=torch.float64).to(dtype)
    weights = torch.ones(experts)
    if case["skew"]:
        weights[0] = 8.0
    ids = torch.stack([torch.multinomial(weights, k, replacement=False, generator=generator)
                       for _ in range(tokens[rank])]) if tokens[rank] else torch.zeros(0, k, dtype=torch.long)
    gates = torch.softmax(torch.randn(tokens[rank], k, generator=generator), dim=-1)
    return x, ids, gates


def _expert_weights(case, world_size):
    """Every expert as a plain (dim, dim_out) matrix: expert e maps a token row x to x @ W[e]."""
    experts, _, _ = _moe_sizes(case, world_size)
    generator = torch.Generator().manual_seed(case["seed"] + 77)
    weights = torch.randn(experts, case["dim"], case["dim_out"], generator=generator, dtype=torch.float64)
    return weights.to(getattr(torch, case["dtype"]))


def _moe_reference(case, world_size):
    """One process, token by token in each rank's order: which assignments are kept (each expert's first `capacity`
    of each rank's), the outputs Σ gate · x @ W[e] (float64), and the rows each rank's local experts receive (by
    local expert, then source rank, then token order) with their counts."""
    experts, k, _ = _moe_sizes(case, world_size)
    weights = _expert_weights(case, world_size).double()
    local = experts // world_size
    kept, outputs, arrivals = [], [], {e: [] for e in range(experts)}
    for rank in range(world_size):
        x, ids, gates = _moe_inputs(case, world_size, rank)
        used, mask = [0] * experts, torch.zeros(ids.shape, dtype=torch.bool)
        y = torch.zeros(x.shape[0], case["dim_out"], dtype=torch.float64)
        for t in range(x.shape[0]):
            for j in range(k):
                e = int(ids[t, j])
                if used[e] < case["capacity"]:
                    used[e] += 1
                    mask[t, j] = True
                    y[t] += float(gates[t, j]) * (x[t].double() @ weights[e])
                    arrivals[e].append(x[t])
        kept.append(mask)
        outputs.append(y)
    received, counts = [], []
    for rank in range(world_size):
        rows = [row for e in range(rank * local, (rank + 1) * local) for row in arrivals[e]]
        received.append(torch.stack(rows) if rows else torch.zeros(0, case["dim"], dtype=getattr(torch, case["dtype"])))
        counts.append([len(arrivals[e]) for e in range(rank * local, (rank + 1) * local)])
    return {"kept": kept, "out": outputs, "received": received, "counts": counts}


def _moe_driver(rank, world_size, module, cases):
    """Per case: dispatch, the local experts applied to the rows of each (as the counts say), combine; what each
    returned, the collectives each started, and whether the inputs were left unchanged."""
    _switch_off_shortcuts(module)
    out = []
    with CollectiveLog() as log:
        for case in cases:
            experts, _, _ = _moe_sizes(case, world_size)
            local = experts // world_size
            x, ids, gates = _moe_inputs(case, world_size, rank)
            weights = _expert_weights(case, world_size)
            kept = [t.clone() for t in (x, ids, gates)]
            start = len(log.events)
            tokens, counts, plan = module.moe_dispatch(x, ids, gates, n_experts=experts, capacity=case["capacity"])
            dispatched = log.events[start:]
            counts = [int(c) for c in counts]
            rows, offset = [], 0
            for e, count in enumerate(counts[:local]):
                rows.append(tokens[offset:offset + count] @ weights[rank * local + e])
                offset += count
            expert_out = torch.cat(rows) if rows else tokens.new_zeros(0, case["dim_out"])
            before = expert_out.clone()
            start = len(log.events)
            y = module.moe_combine(expert_out, plan)
            combined = log.events[start:]
            out.append({"tokens": tokens.detach().clone(), "counts": counts,
                        "kept": torch.as_tensor(plan.kept).detach().clone(),
                        "out": y.detach().clone() if isinstance(y, torch.Tensor) else repr(type(y)),
                        "dispatch": dispatched, "combine": combined,
                        "unchanged": [torch.equal(a, b) for a, b in zip((x, ids, gates, expert_out),
                                                                         kept + [before])]})
    return out


def _describe_moe(case, world_size):
    experts, k, tokens = _moe_sizes(case, world_size)
    return (f"{world_size} rank(s), {experts} experts ({case['per_rank']} per rank), top-{k}, tokens per rank "
            f"{tokens}, dim {case['dim']} -> {case['dim_out']}, capacity {case['capacity']}, {case['dtype']}"
            + (", routing skewed to expert 0" if case["skew"] else ""))


moe_cases = st.fixed_dictionaries({
    "tokens": st.lists(st.integers(0, 5), min_size=4, max_size=4), "dim": st.integers(1, 4),
    "dim_out": st.integers(1, 3), "per_rank": st.integers(1, 2), "k": st.integers(1, 2),
    "capacity": st.integers(0, 6), "skew": st.booleans(), "dtype": st.sampled_from(["float32", "float64"]),
    "seed": st.integers(0, 10**4)})
# Always run: drops under skewed top-2 routing, everything fitting, a rank with no tokens, capacity 0, top-1, and
# enough tokens (17 or more rows to sort) that torch's unstable sort no longer keeps the token order of equal experts.
MOE_CASES = [
    {"tokens": [5, 3, 4, 2], "dim": 3, "dim_out": 2, "per_rank": 2, "k": 2, "capacity": 2, "skew": True,
     "dtype": "float32", "seed": 1},
    {"tokens": [4, 0, 5, 3], "dim": 2, "dim_out": 3, "per_rank": 1, "k": 2, "capacity": 6, "skew": False,
     "dtype": "float64", "seed": 2},
    {"tokens": [3, 4, 0, 5], "dim": 4, "dim_out": 1, "per_rank": 2, "k": 1, "capacity": 1, "skew": True,
     "dtype": "float32", "seed": 3},
    {"tokens": [2, 2, 2, 2], "dim": 1, "dim_out": 2, "per_rank": 1, "k": 1, "capacity": 0, "skew": False,
     "dtype": "float32", "seed": 4},
    {"tokens": [14, 11, 9, 12], "dim": 2, "dim_out": 1, "per_rank": 2, "k": 2, "capacity": 12, "skew": True,
     "dtype": "float64", "seed": 5}]


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@settings(max_examples=1)
@given(cases=st.lists(moe_cases, min_size=1, max_size=4))
@example(cases=MOE_CASES)
def test_moe_dispatch_and_combine_match_one_process(world_size, cases):
    got = run("ex09", _moe_driver, cases, world_size=world_size, timeout=TIMEOUT)
    for index, case in enumerate(cases):
        want = _moe_reference(case, world_size)
        for rank in range(world_size):
            result = got[rank][index]
            where = f"{_describe_moe(case, world_size)}, rank {rank}"
            assert result["kept"].tolist() == want["kept"][rank].tolist(), (
                f"{where}: plan.kept should mark the assignments kept: each expert's first {case['capacity']} of this "
                f"rank's, in token order (the k choices of a token in their order); expected "
                f"{want['kept'][rank].int().tolist()}, got {result['kept'].int().tolist()}")
            assert result["counts"] == want["counts"][rank], (
                f"{where}: counts should give the rows each local expert received, from every rank: "
                f"{want['counts'][rank]}, got {result['counts']}")
            tokens, expected = result["tokens"], want["received"][rank]
            assert tokens.shape == expected.shape and torch.equal(tokens, expected), (
                f"{where}: the tokens received should be the kept tokens' rows, grouped by local expert, then by "
                f"source rank, then in token order ({list(expected.shape)} rows); got {list(tokens.shape)}"
                + ("" if tokens.shape != expected.shape else " with other rows or in another order"))
            y = result["out"]
            assert isinstance(y, torch.Tensor) and y.dtype == getattr(torch, case["dtype"]), (
                f"{where}: moe_combine should return a tensor of the experts' outputs' dtype, {case['dtype']}; got "
                f"{_dtype_name(y)}")
            tolerance = {"rtol": 1e-5, "atol": 1e-5} if case["dtype"] == "float32" else {"rtol": 1e-12, "atol": 1e-12}
            torch.testing.assert_close(y.double(), want["out"][rank], **tolerance, msg=lambda m: (
                f"{where}: each token's output should be Σ over its kept assignments of gate x the expert's output "
                f"(0 for a dropped one), back on the token's own rank in its order\n{m}"))


A2A = ("all_to_all_single", "alltoall_base")  # the method dist.all_to_all_single calls (by torch version)


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_moe_exchanges_counts_then_only_the_kept_tokens(world_size):
    got = run("ex09", _moe_driver, MOE_CASES, world_size=world_size, timeout=TIMEOUT)
    for index, case in enumerate(MOE_CASES):
        want = _moe_reference(case, world_size)
        experts, _, _ = _moe_sizes(case, world_size)
        for rank in range(world_size):
            result = got[rank][index]
            where = f"{_describe_moe(case, world_size)}, rank {rank}"
            dispatched, combined = result["dispatch"], result["combine"]
            rows = sum(want["counts"][rank])
            sent = int(want["kept"][rank].sum())
            assert len(dispatched) == 2 and all(e[0] in A2A for e in dispatched), (
                f"{where}: moe_dispatch should start exactly two dist.all_to_all_single: the counts, then the "
                f"tokens; it started {_kinds(dispatched) or 'nothing'}")
            assert dispatched[0][1] == experts and not dispatched[0][2].startswith("torch.float"), (
                f"{where}: the first all-to-all should carry the counts, one integer per expert ({experts} in all, "
                f"each rank receiving its own experts' counts from every rank); it was {_kinds(dispatched[:1])}")
            assert dispatched[1][1] == rows * case["dim"], (
                f"{where}: the second all-to-all should bring this rank only the kept tokens of its experts, {rows} "
                f"rows of {case['dim']} (drop before sending: a dropped token never travels); it received "
                f"{dispatched[1][1]} elements")
            assert len(combined) == 1 and combined[0][0] in A2A and combined[0][1] == sent * case["dim_out"], (
                f"{where}: moe_combine should start exactly one dist.all_to_all_single that brings back the "
                f"outputs of the {sent} rows this rank sent ({sent * case['dim_out']} elements); it started "
                f"{_kinds(combined) or 'nothing'}")
            changed = [name for name, same in zip(("x", "expert_ids", "gates", "expert_out"), result["unchanged"])
                       if not same]
            assert not changed, f"{where}: moe_dispatch and moe_combine must leave their inputs alone ({changed})"


def _bad_moe_calls():
    x, ids, gates = torch.zeros(3, 2), torch.tensor([[0, 1], [1, 2], [3, 0]]), torch.full((3, 2), 0.5)
    good = {"n_experts": 4, "capacity": 2}
    return [((x[0], ids, gates, good), "x"), ((x.long(), ids, gates, good), "x"),
            ((x, ids.float(), gates, good), "expert_ids"), ((x, ids[:2], gates[:2], good), "expert_ids"),
            ((x, torch.tensor([[0, 1], [1, 4], [3, 0]]), gates, good), "expert_ids"),
            ((x, torch.tensor([[0, 1], [-1, 2], [3, 0]]), gates, good), "expert_ids"),
            ((x, torch.tensor([[0, 1], [2, 2], [3, 0]]), gates, good), "expert_ids"),
            ((x, ids.bool(), gates, good), "expert_ids"), ((x, ids[:, :0], gates[:, :0], good), "expert_ids"),
            ((x, ids, gates[:, :1], good), "gates"), ((x, ids, gates.long(), good), "gates"),
            ((x, ids, gates, {"n_experts": 5, "capacity": 2}), "n_experts"),
            ((x, ids, gates, {"n_experts": 0, "capacity": 2}), "n_experts"),
            ((x, ids, gates, {"n_experts": 4, "capacity": -1}), "capacity"),
            ((x, ids, gates, {"n_experts": 4, "capacity": 1.5}), "capacity")]


def _bad_moe_driver(rank, world_size, module):
    _switch_off_shortcuts(module)
    got = [exception_raised_by(module.moe_dispatch, x, ids, gates, **kw) for (x, ids, gates, kw), _ in _bad_moe_calls()]
    x, ids, gates = torch.zeros(3, 2), torch.tensor([[0, 1], [1, 2], [3, 0]]), torch.full((3, 2), 0.5)
    tokens, counts, plan = module.moe_dispatch(x, ids, gates, n_experts=4, capacity=2)
    got.append(exception_raised_by(module.moe_combine, tokens.new_zeros(tokens.shape[0] + 1, 2), plan))
    return got


@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2])
def test_moe_rejects_bad_arguments(world_size):
    got = run("ex09", _bad_moe_driver, world_size=world_size, timeout=TIMEOUT)
    calls = [(f"moe_dispatch(x {tuple(x.shape)} {_dtype_name(x)}, expert_ids {ids.tolist()}, gates "
              f"{tuple(gates.shape)} {_dtype_name(gates)}, **{kw})", broken) for (x, ids, gates, kw), broken in
             _bad_moe_calls()]
    calls.append(("moe_combine(expert_out with one row more than moe_dispatch returned, plan)", "expert_out"))
    for rank in range(world_size):
        for (where, broken), (raised, message) in zip(calls, got[rank]):
            assert_rejects(f"{where} on rank {rank} of {world_size}", raised, message, broken)
            _assert_names_first(f"{where} on rank {rank} of {world_size}", message, broken,
                                ("x", "expert_ids", "gates", "n_experts", "capacity", "expert_out"))


# ---------------------------------------------------------------- the memory of a layout

LLAMA_3_8B = (128256, 4096, 32, 32, 8, 14336)  # vocab, dim, n_layers, n_heads, n_kv_heads, ffn_dim
LLAMA_3_8B_PARAMETERS = 8_030_261_248


class _Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, ffn):
        super().__init__()
        h = dim // heads
        self.attention = nn.Module()
        for name, rows, columns in (("wq", heads * h, dim), ("wk", kv_heads * h, dim), ("wv", kv_heads * h, dim),
                                    ("wo", dim, heads * h)):
            setattr(self.attention, name, nn.Linear(columns, rows, bias=False))
        self.feed_forward = nn.Module()
        for name, rows, columns in (("w1", ffn, dim), ("w2", dim, ffn), ("w3", ffn, dim)):
            setattr(self.feed_forward, name, nn.Linear(columns, rows, bias=False))
        self.attention_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)


class _Llama(nn.Module):
    """torchtitan's Llama's parameters (no forward: only what each GPU holds is counted)."""

    def __init__(self, vocab, dim, layers, heads, kv_heads, ffn):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(_Block(dim, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)


COLUMN_WISE = ("wq", "wk", "wv", "w1", "w3", "tok_embeddings", "output")  # split on dim 0 by TP
ROW_WISE = ("wo", "w2")  # split on dim 1 by TP


@functools.lru_cache(maxsize=64)
def _meta_parameters(shape):
    """The model's (name, parameter) pairs, built on the meta device (shapes only: Llama 3 8B in milliseconds)."""
    with torch.device("meta"):
        return tuple(_Llama(*shape).named_parameters())


def _elements_per_gpu(shape, fsdp, tp, pp, stage):
    """The elements one GPU of `stage` holds: each parameter of the stage, torch.chunk-ed as TP splits it, then its
    first (largest) FSDP chunk on dim 0, the shard every FSDP rank allocates (FSDP2 pads to it)."""
    per_stage = shape[2] // pp
    total = 0
    for name, param in _meta_parameters(tuple(shape)):
        parts = name.split(".")
        if parts[0] == "layers":
            if not stage * per_stage <= int(parts[1]) < (stage + 1) * per_stage:
                continue
        elif parts[0] == "tok_embeddings" and stage != 0 or parts[0] in ("norm", "output") and stage != pp - 1:
            continue
        owner = parts[-2] if len(parts) > 1 else parts[0]
        local = param
        if owner in COLUMN_WISE:
            local = local.chunk(tp, dim=0)[0]
        elif owner in ROW_WISE:
            local = local.chunk(tp, dim=1)[0]
        total += local.chunk(fsdp, dim=0)[0].numel()
    return total


def _memory_reference(shape, fsdp, tp, pp, stage):
    n = _elements_per_gpu([int(s) for s in shape], int(fsdp), int(tp), int(pp), stage)
    return {"params": 2 * n, "grads": 2 * n, "optimizer": 12 * n, "total": 16 * n}


def _memory_driver(module, calls):
    _switch_off_shortcuts(module)
    out = []
    for shape, layout, stage in calls:
        value = module.plan_memory(module.LlamaShape(*shape), module.Layout(*layout), stage)
        out.append({key: [type(v).__name__, int(v) if isinstance(v, (int, float)) else None]
                    for key, v in value.items()} if isinstance(value, dict) else repr(type(value)))
    return out


def _check_memory(got, calls):
    for (shape, layout, stage), result in zip(calls, got):
        where = (f"plan_memory(LlamaShape{tuple(shape)}, Layout(fsdp={layout[0]!r}, tp={layout[1]!r}, "
                 f"pp={layout[2]!r}), stage={stage})")
        want = _memory_reference(shape, *layout, stage)
        assert isinstance(result, dict) and sorted(result) == sorted(want), (
            f"{where} should return a dict with the keys {sorted(want)}; got {result}")
        for key, value in want.items():
            kind, mine = result[key]
            assert kind == "int" and mine == value, (
                f"{where}[{key!r}] should be the int {value:,} (N = {want['params'] // 2:,} elements per GPU: the "
                f"stage's layers, the embedding on the first stage, the final norm and output on the last; TP splits "
                f"every matrix, the embedding and the output but not the norms; FSDP allocates ceil(rows / fsdp) "
                f"rows of each; 2N bf16 parameters, 2N bf16 gradients, 12N fp32 master weights and AdamW moments); "
                f"got {kind} {mine!r}")


@pytest.mark.points(1)
def test_plan_memory_counts_llama_3_8b():
    n = _elements_per_gpu(LLAMA_3_8B, 1, 1, 1, 0)
    assert n == LLAMA_3_8B_PARAMETERS, f"the test's meta-device Llama 3 8B has {n:,} parameters"  # the test's own
    calls = [(LLAMA_3_8B, (1, 1, 1), 0), (LLAMA_3_8B, (8, 1, 1), 0), (LLAMA_3_8B, (4, 8, 1), 0),
             (LLAMA_3_8B, (2, 2, 4), 0), (LLAMA_3_8B, (2, 2, 4), 1), (LLAMA_3_8B, (2, 2, 4), 3),
             (LLAMA_3_8B, (3, 4, 2), 1)]
    got = run("ex09", _memory_driver, calls, timeout=TIMEOUT)
    assert got[0] == {"params": ["int", 2 * n], "grads": ["int", 2 * n], "optimizer": ["int", 12 * n],
                      "total": ["int", 16 * n]}, (
        f"plan_memory(Llama 3 8B, Layout(1, 1, 1), 0): one GPU holds all {n:,} parameters: 2 bytes each of bf16 "
        f"parameters and gradients, 12 of fp32 master weights and AdamW's two moments, {16 * n:,} bytes in all; "
        f"got {got[0]}")
    _check_memory(got, calls)


def _typed(value, kind):
    import numpy as np

    return {"int": int, "float": float, "numpy": np.int64}[kind](value)


@st.composite
def memory_calls(draw):
    """A model whose sizes the drawn TP and PP degrees divide, a layout and a stage, each count typed as drawn."""
    tp, pp, fsdp = draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 4)), draw(st.integers(1, 8))
    kv_heads = tp * draw(st.integers(1, 2))
    heads = kv_heads * draw(st.integers(1, 3))
    shape = [tp * draw(st.integers(1, 40)), heads * draw(st.integers(1, 6)), pp * draw(st.integers(1, 3)), heads,
             kv_heads, tp * draw(st.integers(1, 24))]
    kinds = draw(st.lists(st.sampled_from(["int", "int", "float", "numpy"]), min_size=9, max_size=9))
    typed = [_typed(v, kind) for v, kind in zip(shape + [fsdp, tp, pp], kinds)]
    return typed[:6], typed[6:], draw(st.integers(0, pp - 1))


# Always run: every stage of a 3-stage layout (first, middle, last), FSDP degrees that divide no row count, GQA
# with TP over the key/value heads, counts typed as floats and numpy integers.
MEMORY_CASES = [([12, 10, 3, 2, 1, 7], [3, 1, 3], 0), ([12, 10, 3, 2, 1, 7], [3, 1, 3], 1),
                ([12, 10, 3, 2, 1, 7], [3, 1, 3], 2), ([8, 24, 4, 4, 2, 6], [5, 2, 2], 1),
                ([20.0, 12, 2, 6, 2, 8], [7, 2.0, 1], 0), ([16, 8, 4, 4, 4, 12], [1, 4, 4], 3)]


@pytest.mark.points(3)
@settings(max_examples=3)
@given(calls=st.lists(memory_calls(), min_size=1, max_size=8))
@example(calls=MEMORY_CASES)
def test_plan_memory_counts_each_gpus_slice(calls):
    got = run("ex09", _memory_driver, calls, timeout=TIMEOUT)
    _check_memory(got, calls)


BAD_LAYOUTS = [((LLAMA_3_8B, (1, 3, 1), 0), "tp"), ((LLAMA_3_8B, (1, 16, 1), 0), "tp"),
               (((128256, 4096, 32, 32, 8, 14002), (1, 8, 1), 0), "tp"), ((LLAMA_3_8B, (1, 1, 3), 0), "pp"),
               ((LLAMA_3_8B, (1, 1, 4), 4), "stage"), ((LLAMA_3_8B, (1, 1, 4), -1), "stage"),
               ((LLAMA_3_8B, (1, 1, 4), 1.0), "stage"), ((LLAMA_3_8B, (1, 1, 4), True), "stage"),
               (((128256, 4100, 32, 32, 8, 14336), (1, 1, 1), 0), "n_heads"),
               (((128256, 4096, 32, 32, 12, 14336), (1, 1, 1), 0), "n_kv_heads"),
               ((LLAMA_3_8B, (0, 1, 1), 0), "fsdp"), ((LLAMA_3_8B, (2.5, 1, 1), 0), "fsdp"),
               ((LLAMA_3_8B, (1, True, 1), 0), "tp"), (((-1, 4096, 32, 32, 8, 14336), (1, 1, 1), 0), "vocab"),
               (((128256, 4096, float("nan"), 32, 8, 14336), (1, 1, 1), 0), "n_layers"),
               (((128256, 4096, 32, 32, 8, "14336"), (1, 1, 1), 0), "ffn_dim")]


def _bad_memory_driver(module, calls):
    _switch_off_shortcuts(module)
    return [exception_raised_by(module.plan_memory, module.LlamaShape(*shape), module.Layout(*layout), stage)
            for shape, layout, stage in calls]


@pytest.mark.points(1)
def test_plan_memory_rejects_bad_layouts():
    got = run("ex09", _bad_memory_driver, [call for call, _ in BAD_LAYOUTS], timeout=TIMEOUT)
    for ((shape, layout, stage), broken), (raised, message) in zip(BAD_LAYOUTS, got):
        where = f"plan_memory(LlamaShape{tuple(shape)}, Layout{tuple(layout)}, stage={stage!r})"
        assert_rejects(where, raised, message, broken)
        _assert_names_first(where, message, broken, ("vocab", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim",
                                                     "fsdp", "tp", "pp", "stage"))


TINY = (10, 6, 2, 3, 1, 5)  # vocab, dim, layers, heads, kv heads, ffn: no row count even, to see FSDP2's padding


def _fsdp2_driver(rank, world_size, module):
    """The elements FSDP2 allocates on this rank for the tiny Llama (fully_shard on each layer and the root: the
    padded shard behind each parameter's local tensor), and the learner's plan for the same layout."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    _switch_off_shortcuts(module)
    mesh = init_device_mesh("cpu", (world_size,))  # on the CPU, also where the grader's ranks see a GPU
    model = _Llama(*TINY)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    allocated = sum(p.to_local().untyped_storage().nbytes() // p.element_size() for p in model.parameters())
    plan = module.plan_memory(module.LlamaShape(*TINY), module.Layout(fsdp=world_size), 0)
    return allocated, plan.get("params") if isinstance(plan, dict) else None


@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2])
def test_plan_memory_matches_what_fsdp2_allocates(world_size):
    got = run("ex09", _fsdp2_driver, world_size=world_size, timeout=TIMEOUT)
    want = _elements_per_gpu(TINY, world_size, 1, 1, 0)
    for rank, (allocated, params) in enumerate(got):
        assert allocated == want, f"rank {rank}: FSDP2 allocated {allocated} elements, the test counts {want}"
        assert params == 2 * allocated, (
            f"plan_memory(LlamaShape{TINY}, Layout(fsdp={world_size}), 0)['params'] should be 2 bytes for each of "
            f"the {allocated} elements FSDP2's fully_shard allocates on rank {rank} (every parameter's dim 0 padded "
            f"to a multiple of {world_size}); got {params!r}")
