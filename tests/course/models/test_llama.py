"""course_lib.models.llama: lesson 09's Llama, against a reference written here, and torchtitan's published counts."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.dist import launch
from course_lib.models import Llama, LlamaConfig, MoEConfig, init_std
from course_lib.models.llama import ffn_hidden_dim
from course_lib.parallel.planner import ModelShape

SMALL = LlamaConfig(vocab_size=64, dim=32, n_layers=4, n_heads=4, ffn_hidden=48, max_seq_len=32)
GQA = LlamaConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=48, max_seq_len=32)
MOE = LlamaConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=1, ffn_hidden=16, max_seq_len=32,
                  moe=MoEConfig(n_experts=4, top_k=2, capacity_factor=1.0))


def _tokens(config, batch=2, seq=12, seed=0):
    return torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _reference_logits(model: Llama, tokens: torch.Tensor) -> torch.Tensor:
    """The dense Llama written out in float64: complex rotary embeddings as torchtitan writes them, explicit masks."""
    cfg = model.config
    sd = {k: v.double() for k, v in model.state_dict().items()}
    hd, (b, s) = cfg.head_dim, tokens.shape
    freqs = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    cis = torch.polar(torch.ones(s, hd // 2, dtype=torch.float64), torch.outer(torch.arange(s).double(), freqs))

    def rms(x, w):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * w

    def rope(x):  # (b, s, heads, hd): pairs (2j, 2j+1) as complex numbers
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous()) * cis[None, :, None, :]
        return torch.view_as_real(z).flatten(-2)

    h = sd["tok_embeddings.weight"][tokens]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        x = rms(h, sd[p + "attention_norm.weight"])
        q = rope((x @ sd[p + "attention.wq.weight"].T).view(b, s, cfg.n_heads, hd))
        k = rope((x @ sd[p + "attention.wk.weight"].T).view(b, s, cfg.kv_heads, hd))
        v = (x @ sd[p + "attention.wv.weight"].T).view(b, s, cfg.kv_heads, hd)
        group = cfg.n_heads // cfg.kv_heads
        out = torch.empty(b, s, cfg.n_heads, hd, dtype=torch.float64)
        for head in range(cfg.n_heads):
            kv = head // group  # query heads 0..group-1 share key/value head 0, and so on
            scores = q[:, :, head] @ k[:, :, kv].transpose(1, 2) / math.sqrt(hd)
            out[:, :, head] = scores.masked_fill(~causal, -math.inf).softmax(-1) @ v[:, :, kv]
        h = h + out.reshape(b, s, -1) @ sd[p + "attention.wo.weight"].T
        x = rms(h, sd[p + "ffn_norm.weight"])
        w1, w2, w3 = (sd[p + f"feed_forward.w{n}.weight"] for n in (1, 2, 3))
        h = h + (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T
    return rms(h, sd["norm.weight"]) @ sd["output.weight"].T


@pytest.mark.parametrize("config", [SMALL, GQA], ids=["heads", "grouped_query"])
def test_logits_match_a_reference_written_out_and_have_torchtitans_names(config):
    model = Llama(config, seed=3)
    tokens = _tokens(config)
    logits = model(tokens)
    assert logits.shape == (2, 12, config.vocab_size) and logits.dtype == torch.float32
    torch.testing.assert_close(logits.double(), _reference_logits(model, tokens), atol=2e-5, rtol=1e-4)
    assert list(model.layers) == [str(i) for i in range(config.n_layers)]
    names = {name for name, _ in model.named_parameters()}
    for suffix in ("attention_norm", "attention.wq", "attention.wk", "attention.wv", "attention.wo", "ffn_norm",
                   "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"):
        assert f"layers.0.{suffix}.weight" in names
    assert {"tok_embeddings.weight", "norm.weight", "output.weight"} <= names
    assert all(not name.endswith("bias") for name in names)
    assert model.layers["0"].attention.wk.weight.shape == (config.kv_heads * config.head_dim, config.dim)
    assert "rope_cos" not in model.state_dict(), "rotary tables are non-persistent buffers, like freqs_cis"


def test_a_later_token_leaves_earlier_logits_unchanged():
    model = Llama(SMALL)
    tokens = _tokens(SMALL, seq=16)
    changed = tokens.clone()
    changed[:, 9] = (changed[:, 9] + 1) % SMALL.vocab_size
    before, after = model(tokens), model(changed)
    torch.testing.assert_close(after[:, :9], before[:, :9], atol=1e-6, rtol=0)
    assert not torch.allclose(after[:, 9:], before[:, 9:])


@pytest.mark.parametrize("config", [SMALL, GQA, MOE], ids=["heads", "grouped_query", "moe"])
def test_meta_then_to_empty_then_init_weights_equals_building_on_the_cpu(config):
    state = torch.random.get_rng_state()
    direct = Llama(config, seed=11)
    assert torch.equal(torch.random.get_rng_state(), state), "building must not draw from the global generator"
    with torch.device("meta"):
        model = Llama(config)
    assert all(p.is_meta for p in model.parameters()) and model.rope_cos.is_meta
    model.to_empty(device="cpu")
    model.init_weights(seed=11)
    for (name, p), (name2, q) in zip(direct.named_parameters(), model.named_parameters()):
        assert name == name2 and torch.equal(p, q), name
    assert torch.equal(direct.rope_cos, model.rope_cos) and torch.equal(direct.rope_sin, model.rope_sin)
    other = Llama(config, seed=12)
    assert not torch.equal(other.output.weight, direct.output.weight)


def _stage(config, keep, *, first, last):
    with torch.device("meta"):
        stage = Llama(config)
    for name in list(stage.layers):
        if name not in keep:
            del stage.layers[name]
    if not first:
        stage.tok_embeddings = None
    if not last:
        stage.norm, stage.output = None, None
    stage.to_empty(device="cpu")
    stage.init_weights(seed=5)
    return stage


def test_pipeline_stages_get_the_full_models_values_and_pass_hidden_states():
    full = Llama(SMALL, seed=5)
    first = _stage(SMALL, {"0", "1"}, first=True, last=False)
    second = _stage(SMALL, {"2", "3"}, first=False, last=True)
    assert list(second.layers) == ["2", "3"] and second.tok_embeddings is None
    expected = dict(full.named_parameters())
    for stage in (first, second):
        for name, p in stage.named_parameters():
            assert torch.equal(p, expected[name]), name
    tokens = _tokens(SMALL)
    hidden = first(tokens)
    assert hidden.shape == (2, 12, SMALL.dim)
    torch.testing.assert_close(second(hidden), full(tokens), atol=1e-6, rtol=0)


def test_init_weights_sees_through_activation_checkpointing_and_follows_torchtitans_stds():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model, direct = Llama(SMALL, seed=2), Llama(SMALL, seed=2)
    for name in list(model.layers):
        model.layers[name] = checkpoint_wrapper(model.layers[name])
    model.init_weights(seed=2)
    for p, q in zip(model.parameters(), direct.parameters()):
        assert torch.equal(p, q)
    assert init_std("layers.3.attention.wo.weight", SMALL) == (0.02 / 8 ** 0.5, (-2.0, 2.0))
    assert init_std("layers.0.feed_forward.w1.weight", SMALL) == (0.02, (-2.0, 2.0))
    assert init_std("layers.1.feed_forward.w3.weight", SMALL)[0] == 0.02 / 4 ** 0.5
    assert init_std("tok_embeddings.weight", SMALL) == (1.0, None)
    std = SMALL.dim ** -0.5
    assert init_std("output.weight", SMALL) == (std, (-3 * std, 3 * std))
    assert init_std("layers.2.ffn_norm.weight", SMALL) is None and bool((direct.norm.weight == 1).all())
    assert init_std("layers.1.moe.experts.w1", MOE)[0] == 0.02
    assert init_std("layers.1.moe.router.weight", MOE)[0] == 0.01
    assert direct.output.weight.abs().max() <= 3 * std
    with pytest.raises(ValueError, match="no init rule"):
        init_std("lora_a.weight", SMALL)


def test_rotary_positions_given_equal_the_default_and_only_relative_positions_matter():
    model = Llama(GQA)
    tokens = _tokens(GQA, seq=10)
    default = model(tokens)
    assert torch.equal(model(tokens, positions=torch.arange(10)), default)
    assert torch.equal(model(tokens, positions=torch.arange(10).expand(2, 10)), default)
    torch.testing.assert_close(model(tokens, positions=torch.arange(10) + 7), default, atol=1e-4, rtol=1e-4)
    per_row = model(tokens, positions=torch.stack([torch.arange(10), torch.arange(10) + 3]))
    torch.testing.assert_close(per_row, default, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(_tokens(GQA, seq=GQA.max_seq_len + 1))


def test_moe_blocks_route_and_add_up_their_losses():
    model = Llama(MOE)
    block = model.layers["0"]
    assert not hasattr(block, "feed_forward") and block.moe.experts.w1.shape == (4, 16, 32)
    logits = model(_tokens(MOE))
    assert logits.shape == (2, 12, MOE.vocab_size)
    aux = model.moe_aux_loss()
    assert aux.requires_grad and aux == sum(b.moe.aux_loss for b in model.layers.values())
    (logits.logsumexp(-1).mean() + aux).backward()
    assert model.layers["1"].moe.router.weight.grad.abs().sum() > 0
    assert Llama(SMALL).moe_aux_loss() == 0


@pytest.mark.parametrize("changes, message", [
    (dict(dim=30), "divisible by n_heads"), (dict(dim=12, n_heads=4), "must be even"),
    (dict(n_kv_heads=3), "divisible by n_kv_heads"), (dict(n_layers=0), "n_layers must be a positive int"),
    (dict(vocab_size=2.5), "vocab_size"), (dict(n_heads=True), "n_heads"), (dict(norm_eps=0), "norm_eps"),
    (dict(rope_theta=float("nan")), "rope_theta"), (dict(moe={"n_experts": 4}), "MoEConfig"),
])
def test_config_errors_say_what_to_change(changes, message):
    with pytest.raises(ValueError, match=message):
        LlamaConfig(**changes)
    with pytest.raises(ValueError, match="8B"):
        LlamaConfig.llama3_1("7B")
    with pytest.raises(ValueError, match="LlamaConfig"):
        Llama({"dim": 64})


@pytest.mark.parametrize("config", [SMALL, GQA, MOE, LlamaConfig()], ids=["heads", "gqa", "moe", "default"])
def test_the_planners_parameter_count_is_the_built_models(config):
    """The planner counts parameters from the config (ModelShape.params); here they are counted on the model."""
    with torch.device("meta"):
        model = Llama(config)
    counted = ModelShape.of(config).params()
    assert counted["total"] == sum(p.numel() for p in model.parameters())
    assert counted["embedding"] == model.tok_embeddings.weight.numel()
    assert counted["layer"] == sum(p.numel() for p in model.layers["0"].parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".moe.experts." in n)
    moe = config.moe
    assert counted["active"] == counted["total"] - experts + (experts * moe.top_k // moe.n_experts if moe else experts)


# Research §1.2 (torchtitan's FFN rule, vocab 128256): the FFN hidden size of each Llama 3.1 flavour.
PUBLISHED_FFN = {"8B": 14336, "70B": 28672, "405B": 53248}


@pytest.mark.parametrize("size", list(PUBLISHED_FFN))
def test_llama3_1_shapes_match_the_published_table(size):
    config = LlamaConfig.llama3_1(size)
    assert config.ffn_hidden == PUBLISHED_FFN[size] and config.kv_heads == 8 and config.vocab_size == 128256
    assert ffn_hidden_dim(256, multiple_of=256) == 768  # torchtitan's debug model


def _sharded_init(rank, world_size):
    """In each rank: torchtitan's TP plan (with sequence parallelism) on a meta model, to_empty, init_weights; and
    FSDP2 the same way. Returns whether every gathered parameter and the logits equal one process's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world_size,))
    reference = Llama(GQA, seed=4)
    tokens = _tokens(GQA, seq=8)
    with torch.device("meta"):
        tp = Llama(GQA)
    parallelize_module(tp, mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(), "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())})
    for block in tp.layers.values():
        parallelize_module(block, mesh, {
            "attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None, None),
                                            desired_input_layouts=(Replicate(), None, None, None)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1))})
    with torch.device("meta"):
        fsdp = Llama(GQA)
    for block in fsdp.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(fsdp, mesh=mesh)
    out = {}
    for kind, model in (("tp", tp), ("fsdp", fsdp)):
        model.to_empty(device="cpu")
        model.init_weights(seed=4)
        expected = dict(reference.named_parameters())
        out[kind] = [name for name, p in model.named_parameters() if not torch.equal(p.full_tensor(), expected[name])]
        logits = model(tokens)
        logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
        out[kind + "_logits"] = (logits - reference(tokens)).abs().max().item()
    out["local_wq_rows"] = tp.layers["0"].attention.wq.weight.to_local().shape[0]
    return out


def test_sharded_meta_model_initialises_to_the_same_values_and_runs_under_torchtitans_tp_plan():
    for result in launch(_sharded_init, 2, backend="gloo", quiet=True, timeout=120):
        assert result["tp"] == [] and result["fsdp"] == [], "each shard is its piece of the full tensor"
        assert result["local_wq_rows"] == GQA.dim // 2, "each rank holds half the query heads"
        assert result["tp_logits"] < 1e-5 and result["fsdp_logits"] < 1e-5
