"""course_lib.parallel.planner: lesson 09's planner against hand arithmetic, the published MFU table, ZeRO's
calculator, the pipeline simulator, invariants over drawn shapes and layouts, and its checks of bad inputs."""

from __future__ import annotations

import contextlib
import io
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.parallel.links import LINKS, all_reduce_time
from course_lib.parallel.pipeline import gpipe_bubble, peak_in_flight, simulate
from course_lib.parallel.planner.comparison import compare_with_published
from course_lib.parallel.planner import (A100_80GB_CLUSTER, ASSUMED_HEADROOM, H100_GRAND_TETON, LLAMA31_8B,
                                         LLAMA31_70B, LLAMA31_405B, PLAN_HEADER, PUBLISHED, Cluster, Layout,
                                         ModelShape, comm_times, enumerate_layouts, flops_per_token, group_link,
                                         layer_activations, memory_per_gpu, mfu, plan_rows, rank_layouts,
                                         recompute_factor, step_time)
from course_lib.parallel.planner.memory import _in_flight
from course_lib.parallel.sharding import comm_volume, zero_memory

FAST = settings(max_examples=60, deadline=None)
TINY = ModelShape(n_layers=2, dim=8, n_heads=2, n_kv_heads=1, ffn_hidden=16, vocab_size=32, name="tiny")


# ------------------------------------------------------------------------------------------------ shapes and FLOPs


def test_llama_shapes_count_the_published_parameters():
    # research/lesson-09.md §1.2: 8.030 B, 70.554 B, 405.853 B; by hand: 2·V·h + L·(2h² + 2h·kv + 3hf + 2h) + h
    for shape, billions in [(LLAMA31_8B, 8.030), (LLAMA31_70B, 70.554), (LLAMA31_405B, 405.853)]:
        h, kv, f, v, n = shape.dim, shape.n_kv_heads * shape.dim // shape.n_heads, shape.ffn_hidden, 128256, \
            shape.n_layers
        by_hand = 2 * v * h + n * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + h
        assert shape.params()["total"] == by_hand == shape.params()["active"]
        assert round(by_hand / 1e9, 3) == billions


def test_flops_per_token_is_torchtitans_count():
    # research §1.2: FLOPs per token at seq 8192, embedding excluded and all parameters
    for shape, excluded, everything in [(LLAMA31_8B, 57.9e9, 61.07e9), (LLAMA31_70B, 481.4e9, 487.75e9),
                                        (LLAMA31_405B, 2625.4e9, 2638.06e9)]:
        assert flops_per_token(shape, 8192) == pytest.approx(excluded, abs=0.05e9)
        assert flops_per_token(shape, 8192, exclude_embedding=False) == pytest.approx(everything, abs=0.005e9)
    # tiny, by hand: N = 1704 − 256 (embedding), 12·l·h·q·t = 12·2·2·4·4
    assert flops_per_token(TINY, 4) == 6 * (1704 - 256) + 12 * 2 * 2 * 4 * 4


# research §1.2's table: (shape, tokens/s per GPU, peak, embedding counted, MFU % computed there, published %)
MFU_TABLE = [
    (LLAMA31_8B, 2904, 312e12, True, 56.84, 56.8), (LLAMA31_8B, 2973, 312e12, True, 58.19, 58.2),
    (LLAMA31_70B, 331, 312e12, True, 51.74, 51.7), (LLAMA31_405B, 109, 989e12, False, 28.94, 29.0),
    (LLAMA31_8B, 5762, 989e12, False, 33.7, None), (LLAMA31_8B, 6667, 989e12, False, 39.0, None),
    (LLAMA31_8B, 5605, 989e12, False, 32.8, None), (LLAMA31_8B, 6514, 989e12, False, 38.1, None),
    # the Float8 rows' published MFU divides by an fp8 peak of 1979e12 (inferred in the research, not stated)
    (LLAMA31_405B, 177, 1979e12, False, 23.48, 23.46), (LLAMA31_405B, 185, 1979e12, False, 24.54, 24.52),
]


@pytest.mark.parametrize("shape, tps, peak, with_embedding, computed, published", MFU_TABLE)
def test_mfu_reproduces_the_published_table_within_a_tenth_of_a_point(shape, tps, peak, with_embedding, computed,
                                                                      published):
    got = 100 * mfu(tps, shape, 8192, peak, exclude_embedding=not with_embedding)
    assert got == pytest.approx(computed, abs=0.1)
    if published is not None:
        assert got == pytest.approx(published, abs=0.1)


def test_model_shape_of_a_config_is_duck_typed():
    dense = SimpleNamespace(vocab_size=32, dim=8, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=16, moe=None)
    assert ModelShape.of(dense, name="tiny") == TINY
    moe = SimpleNamespace(**{**vars(dense), "moe": SimpleNamespace(n_experts=4, top_k=2)})
    shape = ModelShape.of(moe)
    assert (shape.n_experts, shape.top_k, shape.expert_ffn_hidden) == (4, 2, 16)
    p = shape.params()
    assert p["mlp"] == 4 * 3 * 8 * 16 + 8 * 4 and p["mlp_active"] == 2 * 3 * 8 * 16 + 8 * 4
    assert p["active"] < p["total"]
    with pytest.raises(ValueError, match="ffn_hidden"):
        ModelShape.of(SimpleNamespace(vocab_size=32, dim=8, n_layers=2, n_heads=2, n_kv_heads=1, moe=None))
    with pytest.raises(ValueError, match="n_experts and top_k"):
        ModelShape.of(SimpleNamespace(**{**vars(dense), "moe": SimpleNamespace(n_experts=4)}))


# ------------------------------------------------------------------------------------------------ memory by hand


def test_memory_of_a_tiny_model_by_hand():
    m = memory_per_gpu(TINY, Layout(dp_shard=2, activation_checkpointing="none"), 4)
    total = 256 + 2 * (2 * 8 * 8 + 2 * 8 * 4 + 3 * 8 * 16 + 2 * 8) + 8 + 256  # 1704 parameters
    assert (m.params, m.grads, m.optimizer) == (2 * total / 2, 2 * total / 2, 12 * total / 2)
    sbh = 4 * 1 * 8
    per_layer = 4 * sbh + 2 * sbh + 2 * 4 * (8 + 2 * 4) + 2 * sbh + 2 * sbh + 8 * 4 * 16  # norms ... SwiGLU
    assert m.activations == 2 * per_layer + 8 * 4  # two layers and the token ids
    layer, root = 592, 256 + 256 + 8
    assert m.fsdp_buffers == 4 * root + 4 * layer + 6 * layer
    assert m.loss == 2 * sbh + 12 * 4 * 32
    assert m.total == m.params + m.grads + m.optimizer + m.activations + m.fsdp_buffers + m.loss
    assert m.stage == "only" and m.gib()["total"] == round(m.total / 2**30, 1)


def test_layer_activations_by_hand_with_tp_sp_and_checkpointing():
    s, b, h, kv, f, t = 8, 2, 8, 4, 16, 2
    sbh = s * b * h
    none = layer_activations(TINY, s, b, tp=t)
    assert none["stored"] == 4 * sbh / t + 2 * sbh + 2 * s * b * (h + 2 * kv) / t + 2 * sbh / t + 2 * sbh \
        + 8 * s * b * f / t
    assert none["working"] == 0
    no_sp = layer_activations(TINY, s, b, tp=t, sequence_parallel=False)
    assert no_sp["stored"] - none["stored"] == 4 * sbh - 4 * sbh / t  # the norm inputs stay whole
    full = layer_activations(TINY, s, b, tp=t, checkpointing="full")
    assert full["stored"] == 2 * sbh / t and full["working"] == none["stored"] - full["stored"]
    sel = layer_activations(TINY, s, b, checkpointing="selective")  # tp = 1: x, wq, wv, SDPA (+lse), w1, w2
    assert sel["stored"] == 2 * sbh + 2 * sbh + 2 * s * b * kv + 2 * sbh + 4 * s * b * 2 + 2 * s * b * f + 2 * sbh
    scores = layer_activations(TINY, s, b, flash=False)
    assert scores["stored"] - layer_activations(TINY, s, b)["stored"] == 5 * 2 * s * s * b  # 5as²b
    # Korthikanti et al. Table 2's 34sbh for a GPT layer, less its two 1-byte dropout masks: attention 11 − 1,
    # MLP 19 − 1 (input 2, GeLU's input and output 8 + 8: SwiGLU with f = 2h keeps as much), norms 4
    gpt = ModelShape(1, 64, 4, 4, 128, 100)
    assert layer_activations(gpt, 16, 1)["stored"] == (10 + 18 + 4) * 16 * 64


def test_zero_stages_agree_with_sharding_zero_memory():
    total = TINY.params()["total"]
    for stage in range(4):
        m = memory_per_gpu(TINY, Layout(dp_shard=4, zero_stage=stage), 4)
        row = zero_memory(total, 4, stages=[stage])[stage]
        assert (m.params, m.grads, m.optimizer) == (row["params"], row["grads"], row["optimizer"])
        assert (m.fsdp_buffers > 0) == (stage == 3)


def test_tp_shards_matrices_not_norms_and_pp_gives_the_ends_to_the_end_stages():
    shape = ModelShape(8, 64, 4, 2, 128, 1000)
    p = shape.params()
    tp = memory_per_gpu(shape, Layout(tp=2, zero_stage=0), 16)
    matrices = p["total"] - 8 * p["norms"] - p["final_norm"]
    assert tp.params == 2 * (matrices / 2 + 8 * p["norms"] + p["final_norm"])
    pp = memory_per_gpu(shape, Layout(pp=2, n_microbatches=2, zero_stage=0), 16)
    first = 4 * p["layer"] + p["embedding"]
    last = 4 * p["layer"] + p["output"] + p["final_norm"]
    assert pp.params == 2 * (first if pp.stage == "first" else last)


def test_moe_experts_split_over_ep_and_their_all_to_alls_by_hand():
    shape = ModelShape(2, 8, 2, 1, 16, 32, n_experts=4, top_k=2, expert_ffn_hidden=8)
    attention, router, experts, norms = 192, 8 * 4, 4 * 3 * 8 * 8, 16
    dense = 2 * (attention + router + norms) + 256 + 256 + 8
    replicated = memory_per_gpu(shape, Layout(dp_shard=4, ep=4, zero_stage=0), 4)
    assert replicated.params == 2 * (dense + 2 * experts / 4)
    sharded = memory_per_gpu(shape, Layout(dp_shard=4, ep=4, zero_stage=3), 4)  # experts' FSDP: 4·1/4 = 1 rank
    assert sharded.params == 2 * dense / 4 + 2 * 2 * experts / 4
    four = Cluster("four", 4, 1, 80e9, LINKS["NVLink, 8×H100 node"], LINKS["100 Gb/s network"], 989e12, "test")
    comm = comm_times(shape, Layout(dp_shard=4, ep=4, activation_checkpointing="none"), four, 4)
    assert comm["ep"] == pytest.approx(2 * 4 * all_reduce_time(4 * 2 * 8 * 2, 4, four.intra_node) / 2)
    assert {lay.ep for lay in enumerate_layouts(shape, four, 4, 4)} == {1, 2, 4}


def test_in_flight_micro_batches_match_the_pipeline_simulator():
    for p, m in [(2, 2), (4, 4), (4, 9), (8, 8)]:
        one = peak_in_flight(simulate("1f1b", p, m))
        assert _in_flight("1f1b", p, m, 1) == (one[0], one[p - 1]) == (min(p, m), 1)
        gpipe = peak_in_flight(simulate("gpipe", p, m))
        assert _in_flight("gpipe", p, m, 1) == (gpipe[0], gpipe[p - 1])
    for p, v in [(2, 2), (4, 2), (4, 3), (8, 2)]:  # the capped simulation gives the uncapped peak
        m = 4 * p * (v + 2)
        full = peak_in_flight(simulate("interleaved-1f1b", p, m, chunks=v))
        assert _in_flight("interleaved", p, m, v) == (full[0] / v, full[p - 1] / v)
    assert _in_flight("interleaved", 8, 64, 2)[0] == 8 * (1 + 7 / 16)  # Megatron-LM's p·(1 + (p−1)/(p·v))


# ------------------------------------------------------------------------------------------------ invariants


@st.composite
def shapes_and_layouts(draw):
    kv = draw(st.sampled_from([1, 2, 4]))
    heads = kv * draw(st.sampled_from([1, 2, 4]))
    shape = ModelShape(draw(st.sampled_from([2, 4, 8])), heads * draw(st.sampled_from([8, 16])), heads, kv,
                       draw(st.sampled_from([32, 96])), draw(st.sampled_from([64, 1000])))
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if kv % t == 0]))
    pp = draw(st.sampled_from([p for p in (1, 2) if shape.n_layers % p == 0]))
    cp = draw(st.sampled_from([1, 2]))
    layout = Layout(dp_shard=draw(st.sampled_from([2, 4])), tp=tp, pp=pp, cp=cp,
                    micro_batch=draw(st.integers(1, 4)), n_microbatches=pp * draw(st.integers(1, 2)),
                    activation_checkpointing=draw(st.sampled_from(["none", "selective", "full"])),
                    zero_stage=draw(st.sampled_from([0, 1, 2, 3])))
    return shape, layout, 16 * draw(st.integers(1, 8))


def _with(layout: Layout, **changes) -> Layout:
    return Layout(**{**{f: getattr(layout, f) for f in Layout.__dataclass_fields__}, **changes})


@FAST
@given(shapes_and_layouts())
def test_memory_invariants(case):
    shape, layout, seq = case
    m = memory_per_gpu(shape, layout, seq)
    assert min(m.params, m.grads, m.optimizer, m.activations, m.fsdp_buffers, m.loss) >= 0 and m.total > 0
    # more FSDP ranks never more memory per GPU
    assert memory_per_gpu(shape, _with(layout, dp_shard=2 * layout.dp_shard), seq).total <= m.total
    # activations scale with the micro-batch (the schedule's in-flight count does not depend on it)
    double = memory_per_gpu(shape, _with(layout, micro_batch=2 * layout.micro_batch), seq)
    assert double.activations == pytest.approx(2 * m.activations)
    # checkpointing more never keeps more
    stored = [layer_activations(shape, seq, layout.micro_batch, tp=layout.tp, checkpointing=c)["stored"]
              for c in ("none", "selective", "full")]
    assert stored[0] >= stored[1] >= stored[2]
    # CP divides the sequence: cp ranks of seq tokens hold what one rank of seq/cp holds
    assert layer_activations(shape, seq, 1, cp=2)["stored"] == layer_activations(shape, seq // 2, 1)["stored"]
    # replicating (HSDP) never saves memory
    assert memory_per_gpu(shape, _with(layout, dp_replicate=2), seq).total == m.total


@FAST
@given(shapes_and_layouts(), st.floats(0.05, 1.0))
def test_step_time_invariants(case, assumed_mfu):
    shape, layout, seq = case
    cluster = H100_GRAND_TETON.with_nodes(max(1, layout.n_gpus // 8)) if layout.n_gpus >= 8 else \
        Cluster("small", layout.n_gpus, 1, 80e9, LINKS["NVLink, 8×H100 node"], LINKS["100 Gb/s network"], 989e12, "t")
    st_ = step_time(shape, layout, cluster, seq, mfu=assumed_mfu)
    tokens = layout.global_batch() * seq / layout.n_gpus
    assert st_.tokens_per_s_per_gpu * st_.step_s == pytest.approx(tokens)
    assert st_.step_s >= st_.compute_s > 0 and st_.exposed_comm_s >= 0 and 0 <= st_.bubble < 1
    assert st_.mfu_predicted <= assumed_mfu + 1e-12  # recompute, comm and the bubble only take away
    if layout.pp > 1:
        assert st_.bubble == gpipe_bubble(layout.pp, layout.n_microbatches)
    faster = step_time(shape, layout, cluster, seq, mfu=min(1.0, 2 * assumed_mfu))
    assert faster.step_s <= st_.step_s * (1 + 1e-12)


def test_communication_by_hand():
    cluster = H100_GRAND_TETON
    nvlink = cluster.intra_node
    # TP 8 in one node, no checkpointing: 4 all-reduces of b·s·h bf16 per layer
    layout = Layout(tp=8, micro_batch=2, activation_checkpointing="none", zero_stage=0)
    comm = comm_times(LLAMA31_8B, layout, cluster, 1024)
    assert comm["tp"] == pytest.approx(32 * 4 * all_reduce_time(2 * 1024 * 4096 * 2, 8, nvlink))
    # FSDP 8: comm_volume's ZeRO-3 bytes (bf16 gathers, fp32 reduce-scatter) plus α per block
    fsdp = comm_times(LLAMA31_8B, Layout(dp_shard=8), cluster, 1024)["fsdp"]
    sent = comm_volume(LLAMA31_8B.params()["total"], 8, 3, 2, reduce_bytes_per_param=4)["bytes_per_rank"]
    assert fsdp == pytest.approx(sent / nvlink.bandwidth_Bps + 3 * 33 * 7 * nvlink.alpha_s)
    # a group one GPU per node talks over one NIC; a group of whole nodes over all of them, at most NVLink
    net = cluster.inter_node
    assert group_link(cluster.with_nodes(4), 1, 8) is nvlink
    assert group_link(cluster.with_nodes(4), 8, 4).bandwidth_Bps == net.bandwidth_Bps
    assert group_link(cluster.with_nodes(4), 1, 32).bandwidth_Bps == min(8 * net.bandwidth_Bps, nvlink.bandwidth_Bps)
    assert recompute_factor(LLAMA31_8B, 8192, "none") == 1 < recompute_factor(LLAMA31_8B, 8192, "selective") \
        < recompute_factor(LLAMA31_8B, 8192, "full") < 4 / 3


# ------------------------------------------------------------------------------------------------ layouts


def test_enumerate_gives_valid_layouts_and_rank_only_those_that_fit():
    cluster = H100_GRAND_TETON.with_nodes(2)
    layouts = list(enumerate_layouts(LLAMA31_8B, cluster, 32, 8192))
    assert layouts and len(set(layouts)) == len(layouts)
    for lay in layouts:
        assert lay.n_gpus == 16 and lay.global_batch() == 32
        assert lay.tp <= 8 and LLAMA31_8B.n_kv_heads % lay.tp == 0 and LLAMA31_8B.n_layers % lay.pp == 0
        assert lay.pp == 1 or lay.n_microbatches >= lay.pp
    plans = rank_layouts(LLAMA31_8B, cluster, 32, 8192)
    assert plans and all(p.fits and p.memory.total <= ASSUMED_HEADROOM * cluster.memory_bytes for p in plans)
    assert all(p.layout.n_gpus == cluster.n_gpus for p in plans)
    rates = [p.step.tokens_per_s_per_gpu for p in plans]
    assert rates == sorted(rates, reverse=True)
    every = rank_layouts(LLAMA31_8B, cluster, 32, 8192, include_misfits=True)
    assert len(every) == len(layouts) > len(plans)
    rows = plan_rows(plans[:3])
    assert len(rows) == 3 and all(len(r) == len(PLAN_HEADER) for r in rows)
    # 3 sequences do not split over data-parallel ranks: only CP, TP and PP share them out
    assert {lay.dp_replicate * lay.dp_shard for lay in enumerate_layouts(LLAMA31_8B, cluster, 3, 8192)} == {1}


# ------------------------------------------------------------------------------------------------ bad inputs


@pytest.mark.parametrize("make, message", [
    (lambda: ModelShape(2, 10, 4, 2, 16, 32), "multiple of n_heads"),
    (lambda: ModelShape(2, 12, 6, 4, 16, 32), "multiple of n_kv_heads"),
    (lambda: ModelShape(2, 8, 2, 1, 16, 32, n_experts=4, top_k=5, expert_ffn_hidden=8), "top_k"),
    (lambda: ModelShape(2, 8, 2, 1, 16, 32, top_k=2), "n_experts > 0"),
    (lambda: Layout(activation_checkpointing="some"), "activation_checkpointing"),
    (lambda: Layout(pp=2, pp_schedule="interleaved", n_microbatches=2), "virtual_stages"),
    (lambda: Layout(pp=4, n_microbatches=2), "n_microbatches >= pp"),
    (lambda: Layout(pp=2, n_microbatches=3, pp_schedule="interleaved", virtual_stages=2), "multiple of pp"),
    (lambda: Layout(dp_shard=3, ep=2), "ep"),
    (lambda: Layout(zero_stage=4), "zero_stage"),
    (lambda: memory_per_gpu(TINY, Layout(tp=4), 4), "tp"),
    (lambda: memory_per_gpu(TINY, Layout(cp=4), 4), "2·cp"),
    (lambda: step_time(TINY, Layout(dp_shard=4), H100_GRAND_TETON, 4), "multiply to 4 GPUs, not 8"),
    (lambda: step_time(TINY, Layout(dp_shard=8), H100_GRAND_TETON, 4, mfu=1.5), "mfu"),
    (lambda: Cluster("x", 8, 1, 0, LINKS["PCIe 4.0 x16"], LINKS["100 Gb/s network"], 1e12, "t"), "memory_bytes"),
    (lambda: Cluster("x", 8, 1, 1e9, "NVLink", LINKS["100 Gb/s network"], 1e12, "t"), "Link"),
    (lambda: rank_layouts(TINY, H100_GRAND_TETON, 8, 4, headroom=0), "headroom"),
    (lambda: mfu(float("nan"), TINY, 4, 1e12), "tokens_per_s_per_gpu"),
    (lambda: layer_activations(TINY, 4, 1, checkpointing="some"), "checkpointing"),
])
def test_bad_inputs_say_what_to_change(make, message):
    with pytest.raises(ValueError, match=message):
        make()
    with pytest.raises(TypeError, match="whole number"):
        Layout(tp=1.5)


# ------------------------------------------------------------------------------------------------ published runs


def test_published_rows_are_consistent_and_the_benchmark_explains_every_row():
    assert len(PUBLISHED) == 24
    for run in PUBLISHED:
        assert run.layout.n_gpus == run.cluster.n_gpus and len(run.source.commit) == 40
        run.layout.check_against(run.shape, run.seq_len, run.cluster.n_gpus)
    batches = {(r.table, r.label): r.layout.global_batch() for r in PUBLISHED}
    assert batches[("Table 1", "FSDP")] == 16 and batches[("Table 3", "FSDP")] == 256
    assert batches[("Table 4", "2D")] == 512 and batches[("Table 5", "1F1B")] == 256
    assert {r.cluster for r in PUBLISHED if r.table.startswith("A100")} == {A100_80GB_CLUSTER.with_nodes(8)}
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "planner_vs_published.py"
    spec = importlib.util.spec_from_file_location("planner_vs_published", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    table, _ = compare_with_published(0.4)
    assert len(table) == len(PUBLISHED)
    for row, run in zip(table, PUBLISHED):
        assert row[1] == run.label and row[-1].startswith("mem: ") and "tok/s: " in row[-1]
        if run.memory_gib is not None:  # the model is within 25% of every published memory
            assert abs(float(row[2]) - run.memory_gib) / run.memory_gib <= 0.25
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bench.main([]) == 0
    assert "Table 6" in out.getvalue() and "sources:" in out.getvalue()
