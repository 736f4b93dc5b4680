"""course_lib.parallel.compose: each composed layout of lesson 09's Llama against one process, on gloo ranks.

One launch per layout, several checks from it: (1) TP+SP × FSDP2 on a 2×2 mesh, (2) HSDP 2×2, (3) PP × FSDP × TP
2×2×2 with 1F1B. Tolerance: the parameters after one SGD step (lr 0.1) within 1e-6 of one process's, the loss within
1e-6 (research §5: ≤ 4e-9 was seen there; the layouts sum the same products in another order, a reduce-scatter or a
sharded matmul, so they agree to rounding, not bitwise; measured here: 3.0e-8 in each layout, the losses equal). The
mesh's mistakes and an unknown plan key are checked in this process. The whole file: about 35 s on 2 shared cores.
"""

from __future__ import annotations

import collections
import warnings

import pytest
import torch
import torch.nn.functional as F

from course_lib.dist import launch
from course_lib.models import Llama, LlamaConfig
from course_lib.parallel.compose import check_mesh_sizes, parallelize, stage_layers
from course_lib.parallel.planner import Layout, ModelShape, model_parallel_params
from course_lib.parallel.tensor_parallel import tp_comm_volume

# Tiny: 2 layers (1 a stage under pp 2), every size divisible by tp and dp, 4 sequences of 8 tokens.
CFG = LlamaConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, ffn_hidden=48, max_seq_len=8)
BATCH, SEQ, LR, SEED = 4, 8, 0.1, 3
TOLERANCE = 1e-6  # research §5; see the module docstring


def _batch():
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, CFG.vocab_size, (BATCH, SEQ), generator=g),
            torch.randint(0, CFG.vocab_size, (BATCH, SEQ), generator=g))


def _one_process():
    """The oracle: the full model, the global batch's mean loss, one SGD step."""
    model = Llama(CFG, seed=SEED)
    tokens, labels = _batch()
    loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return loss.item(), {name: p.detach() for name, p in model.named_parameters()}


def _build_and_step(rank, world_size, sizes, options, extras=False, second_step=False):
    """In each rank: build the layout (recording the largest tensor any op allocates meanwhile), one step with every
    collective logged, then the full parameters; extras: torch's own handling of an unknown plan key, and TP without
    SP; second_step: another step's collectives (a pipeline's first step also infers shapes). Returns plain data."""
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    from course_lib.parallel.compose import build_mesh, build_model, gather_full, train_step
    from course_lib.parallel.sharding import per_rank_state_bytes
    from course_lib.parallel.tensor_parallel import logged_collectives

    torch.set_num_threads(1)

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            from torch.distributed.tensor import DTensor
            if any(issubclass(t, DTensor) for t in types):
                return NotImplemented  # DTensor turns itself into plain ops, which come back here
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and not t.is_meta:
                    Largest.largest = max(Largest.largest, t.untyped_storage().nbytes())
            return out

    mesh = build_mesh(sizes)
    with Largest():
        composed = build_model(CFG, mesh, seed=SEED, **options)
    names = {mesh.get_group(n).group_name: n for n in mesh.mesh_dim_names}
    with logged_collectives(all_groups=True) as log:
        loss = train_step(composed, *_batch(), lr=LR)
    full = gather_full(composed.model)
    coords = {n: mesh[n].get_local_rank() for n in mesh.mesh_dim_names}
    out = {"loss": loss, "coords": coords, "largest_alloc": Largest.largest,
           "params_bytes": per_rank_state_bytes(composed.model)["params"],
           "layers": list(composed.model.layers), "first": composed.first, "last": composed.last,
           "log": [(names.get(e["group"], "?"), e["op"], e["numel"], e["bytes"]) for e in log],
           "timeouts_s": [mesh.get_group(n)._get_backend(torch.device("cpu")).options._timeout.total_seconds()
                          for n in mesh.mesh_dim_names],
           "world_timeout_s": dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout.total_seconds(),
           "placements": {n: str(p.placements) for n, p in composed.model.named_parameters()
                          if n in ("layers.0.attention.wq.weight", "layers.0.ffn_norm.weight")}}
    if all(v == 0 for k, v in coords.items() if k != "pp"):  # one rank per stage returns the full tensors
        out["params"] = full["params"]
    if second_step:
        with logged_collectives(all_groups=True) as log:
            train_step(composed, *_batch(), lr=LR)
        out["log2"] = [(names.get(e["group"], "?"), e["op"], e["numel"], e["bytes"]) for e in log]
    if extras:
        out |= _torch_skips_unknown_keys(mesh["tp"])
        out |= _without_sequence_parallel(mesh, names)
    return out


def _torch_skips_unknown_keys(tp_mesh):
    """What parallelize_module itself does with a key that names nothing (compose.parallelize raises instead)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    with torch.device("meta"):
        model = Llama(CFG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallelize_module(model.layers["0"], tp_mesh, {"attention.w_q": ColwiseParallel()})
    return {"torch_warning": [str(w.message) for w in caught],
            "torch_left_it_plain": type(model.layers["0"].attention.wq.weight).__name__}


def _without_sequence_parallel(mesh, names):
    """The same model with TP alone (no SP), one forward and backward: Megatron's all-reduces instead."""
    from course_lib.parallel.compose import build_model, cross_entropy
    from course_lib.parallel.tensor_parallel import logged_collectives

    composed = build_model(CFG, mesh, seed=SEED, sequence_parallel=False)
    tokens, labels = (t.chunk(2)[mesh["dp"].get_local_rank()] for t in _batch())
    with logged_collectives(all_groups=True) as log, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        cross_entropy(composed.model(tokens), labels).backward()
    return {"no_sp_log": [(names.get(e["group"], "?"), e["op"], e["numel"]) for e in log]}


def _counts(log, group):
    return dict(collections.Counter(op for g, op, *_ in log if g == group))


def _assert_matches_one_process(results):
    loss, expected = _one_process()
    losses = [r["loss"] for r in results if r["loss"] is not None]
    assert losses and max(abs(x - loss) for x in losses) < TOLERANCE
    got = {}
    for r in results:
        got |= r.get("params", {})
    assert got.keys() == expected.keys(), "the stages together hold every parameter once"
    worst = max((got[n] - p).abs().max().item() for n, p in expected.items())
    assert worst < TOLERANCE, worst
    return worst


def _planner_params(layout, stage):
    """Parameters per rank by the planner (after TP and PP, then FSDP's 1/fsdp), in float32 bytes."""
    return model_parallel_params(ModelShape.of(CFG), layout, stage)["dense"] / layout.fsdp * 4


def _largest_param_bytes():
    with torch.device("meta"):
        model = Llama(CFG)
    return max(p.numel() for p in model.parameters()) * 4, sum(p.numel() for p in model.parameters()) * 4


# ----------------------------------------------------------------------------------------------- in this process


@pytest.mark.parametrize("sizes, world, message", [
    ({"tp": 2, "dp": 2}, 4, r"tp must be the innermost .* Write \{'dp': 2, 'tp': 2\}"),
    ({"dp": 2, "pp": 2}, 4, r"outermost first, in torchtitan's order .* Write \{'pp': 2, 'dp': 2\}"),
    ({"dp_shard": 2, "dp_replicate": 2}, 4, r"Write \{'dp_replicate': 2, 'dp_shard': 2\}"),
    ({"dp": 2, "tp": 2}, 8, "holds 4 ranks but 8 were launched: make the sizes multiply to 8"),
    ({"data": 4}, 4, "unknown mesh dimension 'data'"),
    ({"dp": 2, "dp_shard": 2}, 4, "names dp_shard twice"),
    ({"dp": 0, "tp": 4}, 4, "whole number of ranks"),
])
def test_mesh_mistakes_say_what_to_write(sizes, world, message):
    with pytest.raises(ValueError, match=message):
        check_mesh_sizes(sizes, world)


def test_tp_across_nodes_is_refused_and_the_order_is_torchtitans():
    with pytest.raises(ValueError, match=r"tp=16 does not divide the 8 ranks of a node: .* span two nodes"):
        check_mesh_sizes({"dp": 2, "tp": 16}, 32, ranks_per_node=8)
    assert check_mesh_sizes({"pp": 2, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 8}, 64, 8) == {
        "pp": 2, "dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 8}


def test_stages_are_cut_as_torchtitan_cuts_them():
    # generate_llm_fqn_per_model_part: the embedding and the norm+output weigh one layer each, extras go first
    assert stage_layers(2, 2) == [["0"], ["1"]]
    assert stage_layers(4, 2) == [["0", "1"], ["2", "3"]]
    assert stage_layers(8, 4) == [["0", "1"], ["2", "3", "4"], ["5", "6"], ["7"]]
    with pytest.raises(ValueError, match="would leave a stage empty"):
        stage_layers(1, 4)


def test_a_plan_key_that_matches_nothing_is_a_value_error_naming_the_modules():
    with torch.device("meta"):
        model = Llama(CFG)
    with pytest.raises(ValueError, match=r"plan key 'attention.w_q' matches no submodule of TransformerBlock, .*"
                                         r"'attention.wq'"):
        parallelize(model.layers["0"], None, {"attention.w_q": None, "attention.wk": None})
    with pytest.raises(ValueError, match="plan key 'layer.*'"):
        parallelize(model, None, {"layer.*": None})


@pytest.mark.parametrize("names", [("dp_replicate",), ("tp",), ("dp_shard", "dp_replicate"), ("dp", "tp")])
def test_fsdp_refuses_a_mesh_it_would_shard_the_wrong_way(names):
    from types import SimpleNamespace

    from course_lib.parallel.compose import apply_fsdp

    mesh = SimpleNamespace(ndim=len(names), mesh_dim_names=names)  # only its names are read before the check
    with pytest.raises(ValueError, match=r"HSDP: mesh\['dp_replicate', 'dp_shard'\], dp_shard may be 1\)"):
        apply_fsdp(None, mesh)


# ----------------------------------------------------------------------------------------------- the layouts


@pytest.mark.timeout(150)
def test_tp_with_sequence_parallel_times_fsdp_on_2x2_matches_one_process():
    results = launch(_build_and_step, 4, {"dp": 2, "tp": 2}, {"loss_parallel": True}, True, backend="gloo", quiet=True,
                     timeout=120)
    _assert_matches_one_process(results)
    r, (L, b, s, h) = results[0], (CFG.n_layers, BATCH // 2, SEQ, CFG.dim)
    assert r["placements"]["layers.0.attention.wq.weight"] == "(_StridedShard(dim=0, sf=2), Shard(dim=0))"
    # FSDP2 (dp group): one all-gather per unit forward (L blocks + root), again per block in backward (the root
    # keeps its parameters), one reduce-scatter of gradients per unit; + the loss's average (train_step).
    assert _counts(r["log"], "dp") == {"all_gather": 2 * L + 1, "reduce_scatter": L + 1, "all_reduce": 1}
    # TP+SP (tp group): forward, the embedding's reduce-scatter, per block 2 all-gathers (attention and MLP inputs)
    # and 2 reduce-scatters (wo, w2), the output's all-gather; backward, the mirror; all-reduces: the 2L + 1 norm
    # weights' gradients (Partial, as SP's norms see a slice of the tokens) and loss_parallel's 3 of (b·s) values.
    tp = _counts(r["log"], "tp")
    assert tp == {"all_gather": 2 * (2 * L + 1), "reduce_scatter": 2 * (2 * L + 1), "all_reduce": 2 * L + 1 + 3}
    blocks = [e for e in r["log"] if e[0] == "tp" and e[1] != "all_reduce" and e[2] in (b * s * h, b * s * h // 2)]
    from course_lib.parallel.sharding import ring_bytes_sent
    sent = ring_bytes_sent([{"op": op, "bytes": nbytes} for _, op, _, nbytes in blocks], 2)["total"]
    # SP's reduce-scatter + all-gather send what Megatron's all-reduce sends: attention + MLP, forward + backward,
    # per layer (+ the embedding's and the output's pair, both b·s·h)
    megatron = tp_comm_volume(b, s, h, 2, dtype_bytes=4)["ring_bytes_per_rank"]
    assert sent == 2 * megatron * L + megatron
    # Without SP (Megatron's TP): all-reduces of b·s·h, per layer 2 forward (wo, w2) and 5 backward, one per
    # column-parallel module's input gradient (wq, wk, wv, w1, w3: torchtitan's plan keeps them separate, where
    # Megatron fuses QKV into one all-reduce), + the embedding's forward one and the output's input gradient; and the
    # all-gather of the logits. SP's PrepareModuleInput gathers once per attention and MLP: one reduce-scatter back.
    no_sp = _counts(r["no_sp_log"], "tp")
    assert no_sp == {"all_reduce": 7 * L + 2, "all_gather": 1}, no_sp
    assert all(n == b * s * h for g, op, n in r["no_sp_log"] if g == "tp" and op == "all_reduce")
    # torch only warns about a key that names nothing, and leaves the module unsharded
    assert any("could not be resolved" in w for w in r["torch_warning"]) and r["torch_left_it_plain"] == "Parameter"
    _assert_built_sharded(results, Layout(dp_shard=2, tp=2), {0: "only"})


def _assert_built_sharded(results, layout, stage_of):
    """The full model never existed: no op allocated more than one full parameter (init_weights draws each in full,
    then keeps the shard), and each rank holds the planner's parameters per GPU; the groups kept launch's timeout."""
    largest_param, full_model = _largest_param_bytes()
    for r in results:
        assert r["largest_alloc"] <= largest_param < full_model / 4
        stage = stage_of[r["coords"].get("pp", 0)]
        assert r["params_bytes"] == _planner_params(layout, stage), (r["params_bytes"], stage)
        assert r["timeouts_s"] == [r["world_timeout_s"]] * len(r["timeouts_s"])


@pytest.mark.timeout(150)
def test_hsdp_2x2_matches_one_process():
    results = launch(_build_and_step, 4, {"dp_replicate": 2, "dp_shard": 2}, {}, backend="gloo", quiet=True,
                     timeout=120)
    _assert_matches_one_process(results)
    r, L = results[0], CFG.n_layers
    assert r["placements"]["layers.0.ffn_norm.weight"] == "(Replicate(), Shard(dim=0))"
    assert _counts(r["log"], "dp_shard") == {"all_gather": 2 * L + 1, "reduce_scatter": L + 1, "all_reduce": 1}
    # HSDP: the reduce-scattered gradient shards are then all-reduced over the replicas, one per unit
    assert _counts(r["log"], "dp_replicate") == {"all_reduce": L + 1 + 1}
    _assert_built_sharded(results, Layout(dp_replicate=2, dp_shard=2), {0: "only"})


@pytest.mark.timeout(240)
def test_pipeline_times_fsdp_times_tp_2x2x2_with_1f1b_matches_one_process():
    results = launch(_build_and_step, 8, {"pp": 2, "dp": 2, "tp": 2}, {"n_microbatches": 2}, False, True,
                     backend="gloo", quiet=True, timeout=200)
    _assert_matches_one_process(results)
    for r in results:
        stage = r["coords"]["pp"]
        assert r["layers"] == [str(stage)] and (r["first"], r["last"]) == (stage == 0, stage == 1)
        p2p = [e for e in r["log"] if e[0] == "pp"]
        assert p2p == [], "activations go point to point (isend/irecv), which the collective log does not see"
    # FSDP under PP, reshard_after_forward=False (torchtitan's default): each unit (this stage's block, the root)
    # all-gathers once a step, not once a micro-batch, and reduce-scatters once, after the last micro-batch's
    # backward (PipelineStage turns gradient sync off before). The first step all-gathers twice: a dynamic
    # PipelineStage first runs the first micro-batch for its shapes, then reshards (_post_metadata_inference_cleanup
    # in torch 2.14.1's pipelining/stage.py). + 1 all-reduce of the loss on the last stage.
    for r in results:
        last = r["coords"]["pp"] == 1
        assert _counts(r["log"], "dp") == {"all_gather": 4, "reduce_scatter": 2} | ({"all_reduce": 1} if last else {})
        assert _counts(r["log2"], "dp") == {"all_gather": 2, "reduce_scatter": 2} | ({"all_reduce": 1} if last else {})
    _assert_built_sharded(results, Layout(pp=2, dp_shard=2, tp=2, n_microbatches=2), {0: "first", 1: "last"})
