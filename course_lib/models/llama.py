"""A small Llama-style decoder with torchtitan's module names, built on `meta` and initialised after sharding
(lesson 09, notebooks/09_putting_it_together.ipynb).

    LlamaConfig(vocab_size, dim, n_layers, n_heads, n_kv_heads, ffn_hidden, norm_eps, rope_theta, max_seq_len, moe)
    LlamaConfig.llama3_1("8B" | "70B" | "405B")   Llama 3.1's published shapes, as configs
    ffn_hidden_dim(dim, multiple_of, multiplier)   torchtitan's SwiGLU hidden size rule
    Llama(config, seed=0)                          tok_embeddings, layers "0".."n-1", norm, output; .init_weights(seed)
    rope_tables, apply_rope                        rotary embeddings in real arithmetic

Its parameters and training FLOPs are counted by the planner from its config (`course_lib.parallel.planner`:
`ModelShape.of(config).params()`, `flops_per_token`); the tests check that count against the built model.

Names and forward follow torchtitan's Llama 3 (torchtitan/models/llama3/model/model.py @018740b7), so its tensor
parallel plan applies by name: `tok_embeddings`, `layers.{i}.attention_norm`, `.attention.wq/wk/wv/wo`, `.ffn_norm`,
`.feed_forward.w1/w2/w3` (or `.moe.router`, torchtitan's `.moe.router.gate`, and `.moe.experts.w1/w2/w3`), `norm`,
`output`. A block calls `attention(x, rope_cos, rope_sin, positions)`: four inputs, as torchtitan's (x, freqs_cis,
masks, positions), so its `apply_tp` (torchtitan/models/llama3/infra/parallelize.py @018740b7) fits unchanged, with
`PrepareModuleInput(input_layouts=(Shard(1), None, None, None), ...)`: the tests run that plan on 2 gloo ranks.
Attention reshapes with `view(b, s, -1, head_dim)`: under TP a rank holds a slice of the heads. Residuals are out of
place (an in-place `x += ...` on an FSDP2 module's output skips its all-gather, research §4.4). A pipeline stage
deletes layers by name (`del model.layers["0"]`) and sets `tok_embeddings`, `norm` or `output` to None: forward then
takes and returns hidden states, as torchtitan's does. Rotary embeddings turn adjacent pairs (x[2j], x[2j+1]),
torchtitan's layout (picotron and Hugging Face turn the two halves instead); Llama 3.1's long-context rescaling of
the frequencies is left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.models.moe import MoE, MoEConfig, _positive_int, fill_seeded_, moe_param_std

__all__ = ["LlamaConfig", "ffn_hidden_dim", "rope_tables", "apply_rope", "CausalAttention", "Attention",
           "FeedForward", "TransformerBlock", "Llama", "init_std"]

# torchtitan/models/llama3/__init__.py @00f555e1, `llama3_configs`: dim, n_layers, n_heads, and the FFN rule's
# multiple_of and ffn_dim_multiplier; every size has 8 KV heads and rope theta 500000.
LLAMA3_1 = {"8B": (4096, 32, 32, 1024, 1.3), "70B": (8192, 80, 64, 4096, 1.3), "405B": (16384, 126, 128, 4096, 1.2)}


def ffn_hidden_dim(dim: int, multiple_of: int, multiplier: float | None = None) -> int:
    """torchtitan's SwiGLU hidden size: int(2 · 4·dim / 3), times `multiplier` (int), rounded up to `multiple_of`
    (`FeedForward.__init__`, torchtitan/models/llama3/model/model.py @018740b7). 8B: 14336, 70B: 28672, 405B: 53248."""
    hidden = int(2 * (4 * dim) / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama's shape. n_kv_heads None: n_heads (grouped-query attention when smaller); moe a MoEConfig: every
    block's MLP is a mixture of experts of ffn_hidden each. The defaults are small: measured here, FSDP2 over 8 gloo
    ranks on 2 shared CPU cores took 0.43-0.47 s a training step (batch 2 × 64 tokens a rank), 0.8 s the first."""

    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None
    ffn_hidden: int = 192
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 64
    moe: MoEConfig | None = None

    def __post_init__(self):
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "ffn_hidden", "max_seq_len"):
            _positive_int(getattr(self, name), name)
        if self.n_kv_heads is not None:
            _positive_int(self.n_kv_heads, "n_kv_heads")
        if self.dim % self.n_heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads}): each head gets "
                             f"dim // n_heads features; choose n_heads among the divisors of dim")
        if self.head_dim % 2:
            raise ValueError(f"dim // n_heads ({self.head_dim}) must be even: rotary embeddings turn pairs of "
                             f"features; change dim or n_heads")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.kv_heads}): each "
                             f"key/value head serves n_heads // n_kv_heads query heads")
        for name in ("norm_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.moe is not None and not isinstance(self.moe, MoEConfig):
            raise ValueError(f"moe must be None or a MoEConfig, got {type(self.moe).__name__}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @classmethod
    def llama3_1(cls, size: str, *, max_seq_len: int = 131072) -> LlamaConfig:
        """Llama 3.1 8B, 70B or 405B: torchtitan's `llama3_configs` (torchtitan/models/llama3/__init__.py
        @00f555e1; norm_eps 1e-5 and vocab 128256 from llama3/model/args.py), FFN hidden by ffn_hidden_dim."""
        if size not in LLAMA3_1:
            raise ValueError(f"size must be one of {sorted(LLAMA3_1)}, got {size!r}")
        dim, n_layers, n_heads, multiple_of, multiplier = LLAMA3_1[size]
        return cls(vocab_size=128256, dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=8,
                   ffn_hidden=ffn_hidden_dim(dim, multiple_of, multiplier), norm_eps=1e-5, rope_theta=500000.0,
                   max_seq_len=max_seq_len)


def rope_tables(head_dim: int, max_seq_len: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, (max_seq_len, head_dim // 2), of the angles m·θ_j with θ_j = theta^(−2j/head_dim) (RoFormer, Su
    et al., arXiv 2104.09864, §3; torchtitan's `precompute_freqs_cis` without Llama 3.1's scaling)."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, device=device).float(), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               positions: torch.Tensor | None = None) -> torch.Tensor:
    """Turn each pair (x[2j], x[2j+1]) of x (b, s, heads, head_dim) by the angle of its position: the complex
    product (a + ib)(cos + i·sin) of torchtitan's `apply_rotary_emb`, in real numbers. positions: (s,) or (b, s)
    indices into the tables, default 0..s−1 (context parallelism passes each rank's own)."""
    if positions is None:
        positions = torch.arange(x.shape[1], device=cos.device)
    cos, sin = cos[positions].unsqueeze(-2), sin[positions].unsqueeze(-2)
    a, b = x.float()[..., 0::2], x.float()[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).type_as(x)


class CausalAttention(nn.Module):
    """softmax(q·kᵀ/√d + causal mask)·v, each key/value head shared by n_heads // n_kv_heads query heads in a row
    (grouped-query attention, Ainslie et al., arXiv 2305.13245; torchtitan's `repeat_kv`). q (b, hq, s, d); k, v
    (b, hkv, s, d): a rank's local heads under TP. The mask is the local order and `positions` is unused: context
    parallelism replaces this module, `attention.inner_attention` (where torchtitan applies CP too, in
    llama3/infra/parallelize.py @018740b7), by one that masks by position."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        repeat = q.shape[1] // k.shape[1]
        if repeat > 1:
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    """Multi-head causal self-attention with rotary embeddings: wq, wk, wv, wo, no biases."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.head_dim = config.head_dim
        self.wq = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)
        self.inner_attention = CausalAttention()

    def forward(self, x: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        # -1, not n_heads: tensor parallelism leaves each rank a slice of the heads.
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = apply_rope(q, rope_cos, rope_sin, positions), apply_rope(k, rope_cos, rope_sin, positions)
        out = self.inner_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), positions)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU (Shazeer, arXiv 2002.05202): w2(silu(w1·x) * w3·x), no biases."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: h = x + attention(attention_norm(x)); out = h + mlp(ffn_norm(h)), mlp `feed_forward` or,
    with config.moe, `moe` (torchtitan's llama4/deepseek_v3 name)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.moe_enabled = config.moe is not None
        if self.moe_enabled:
            self.moe = MoE(config.dim, config.ffn_hidden, config.moe)
        else:
            self.feed_forward = FeedForward(config.dim, config.ffn_hidden)

    def forward(self, x: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope_cos, rope_sin, positions)
        mlp = self.moe if self.moe_enabled else self.feed_forward
        return h + mlp(self.ffn_norm(h))


# Prefixes that wrappers put into parameter names (activation checkpointing, torch.compile), dropped before seeding.
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")


def init_std(name: str, config: LlamaConfig) -> tuple[float, tuple[float, float] | None] | None:
    """torchtitan's init of one parameter (torchtitan/models/llama3/model/model.py @018740b7, `init_weights`, with
    depth_init=True, the default of llama3/model/args.py): (std, truncation bounds) of a normal, or None for ones
    (the RMSNorm weights). tok_embeddings N(0, 1); wq, wk, wv, w1 and the experts' w1 N(0, 0.02²) truncated at ±2
    (nn.init.trunc_normal_'s absolute default); wo, w2, w3, the router and the experts' w2, w3 0.02/√(2(i+1)) in
    layer i; output dim^−½ truncated at ±3 std."""
    if name == "tok_embeddings.weight":
        return 1.0, None
    if name == "output.weight":
        std = config.dim ** -0.5
        return std, (-3 * std, 3 * std)
    if name.endswith("norm.weight"):
        return None
    parts = name.split(".")
    if parts[0] != "layers" or len(parts) < 4:
        raise ValueError(f"no init rule for parameter {name!r}")
    depth_std = 0.02 / (2 * (int(parts[1]) + 1)) ** 0.5
    if parts[2] == "moe":
        return moe_param_std(".".join(parts[3:]), depth_std), (-2.0, 2.0)
    if parts[-2] in ("wq", "wk", "wv", "w1"):
        return 0.02, (-2.0, 2.0)
    return depth_std, (-2.0, 2.0)


class Llama(nn.Module):
    """The decoder: logits (batch, seq, vocab) = output(norm(layers(tok_embeddings(tokens)))).

    Built on a real device it is initialised at once with `seed`; under `with torch.device("meta")` it holds no
    memory until `to_empty(device=...)`, after which `init_weights(seed)` gives exactly the values the direct build
    gives. Each parameter comes from its own generator, seeded by the seed and its name (moe.fill_seeded_), so a
    pipeline stage holding layers "2" and "3" gets the full model's values for them, and a sharded (DTensor)
    parameter gets its shard of the same full tensor. Building never draws from the global random generator: the
    modules are made on `meta`, then moved with to_empty and initialised."""

    def __init__(self, config: LlamaConfig, *, seed: int = 0):
        super().__init__()
        if not isinstance(config, LlamaConfig):
            raise ValueError(f"config must be a LlamaConfig, got {type(config).__name__}")
        self.config = config
        device = torch.get_default_device()  # `with torch.device("meta")` sets it
        with torch.device("meta"):  # nn.Linear's own init would draw from the global generator, for nothing
            self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
            self.layers = nn.ModuleDict({str(i): TransformerBlock(config) for i in range(config.n_layers)})
            self.norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
            self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
            cos, sin = rope_tables(config.head_dim, config.max_seq_len, config.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)  # like torchtitan's freqs_cis: not in state_dict
        self.register_buffer("rope_sin", sin, persistent=False)
        if device.type != "meta":
            self.to_empty(device=device)
            self.init_weights(seed)

    def init_weights(self, seed: int = 0) -> None:
        """Recompute the rotary tables on their device (to_empty leaves them garbage) and set every parameter this
        module still holds by init_std, from a generator seeded by (seed, its name)."""
        cfg = self.config
        self.rope_cos, self.rope_sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta,
                                                   device=self.rope_cos.device)
        for name, param in self.named_parameters():
            for prefix in WRAPPER_PREFIXES:
                name = name.replace(prefix, "")
            rule = init_std(name, cfg)
            if rule is None:
                with torch.no_grad():
                    param.fill_(1.0)
            else:
                fill_seeded_(param, name, seed, *rule)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """tokens (batch, seq) ints, or hidden states (batch, seq, dim) where tok_embeddings is None; returns
        logits, or hidden states where output is None. positions: see apply_rope."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        if positions is None and h.shape[1] > self.config.max_seq_len:
            raise ValueError(f"sequence of {h.shape[1]} tokens is longer than max_seq_len "
                             f"({self.config.max_seq_len}): raise max_seq_len in the config")
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin, positions)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h

    def moe_aux_loss(self) -> torch.Tensor:
        """The sum of this module's MoE load-balancing losses from its last forward (0 without MoE)."""
        losses = [m.aux_loss for m in self.modules() if isinstance(m, MoE) and m.aux_loss is not None]
        return torch.stack(losses).sum() if losses else torch.zeros((), device=self.rope_cos.device)
