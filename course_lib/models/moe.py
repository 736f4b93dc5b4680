"""A mixture-of-experts MLP in one process: routing, capacity, the load-balancing loss (lesson 09,
notebooks/09_putting_it_together.ipynb).

    MoEConfig(n_experts, top_k, capacity_factor, aux_loss_coef)   the MLP of every block becomes a MoE
    route(logits, config) -> Routing          which experts each token goes to, with which gate; what is dropped
    run_experts(x, routing, w1, w2, w3)       each expert's SwiGLU on its tokens, weighted and summed back
    expert_capacity(tokens, experts, top_k, capacity_factor)   the most assignments an expert takes
    load_balancing_loss(probs, experts, coef)  Switch Transformer's auxiliary loss
    MoE(dim, hidden, config)                  the module: `router`, `experts` (GroupedExperts: w1, w2, w3)
    fill_seeded_(param, key, seed, std, bounds)  one parameter from a generator seeded by its name (llama.py too)

Routing is token choice (each token picks its top k experts). The steps and their sources:
- router: a Linear dim -> n_experts without bias, then a softmax over the experts in (at least) float32 (Switch,
  Fedus et al., arXiv 2101.03961, §2.1; torchtitan `TokenChoiceTopKRouter`, torchtitan/models/moe/moe.py @003edbe5).
- the top k of those probabilities, renormalised to sum to 1 over the k chosen, as Mixtral does
  (`MixtralSparseMoeBlock`: `routing_weights /= routing_weights.sum(dim=-1, keepdim=True)`, huggingface/transformers
  src/transformers/models/mixtral/modeling_mixtral.py @00d4b3d2) and DeepSpeed's GShard top-2 gate (`top2gating`,
  g1 and g2 divided by g1 + g2, deepspeed/moe/sharded_moe.py @0c691a52). Switch (k = 1) keeps p_i(x)
  unnormalised; torchtitan renormalises only with `route_norm=True`.
- capacity: ceil(capacity_factor · tokens · top_k / n_experts) assignments per expert. Switch §2.2 defines
  "expert capacity = (tokens per batch / number of experts) × capacity factor" for k = 1; DeepSpeed's
  `topkgating` multiplies the factor by k and rounds up (`_capacity`: torch.ceil). capacity_factor None is
  dropless (torchtitan, MegaBlocks): every assignment is computed.
- drops: an expert takes its assignments first come, first served in token order (token 0 before token 1; a token
  picks an expert at most once), as DeepSpeed's `topkgating` with drop_policy="position" (a cumulative sum over the
  tokens). DeepSpeed's `top2gating` instead queues every first choice before any second choice. A dropped
  assignment contributes zero: the block's residual carries the token (Switch §2.2). The gates of the kept
  assignments are not renormalised again (DeepSpeed's `topkgating` does renormalise over the survivors).
- load balancing: coef · N · Σ_i f_i · P_i (Switch §2.2, eqs. 4–6), P_i the mean router probability of expert i,
  f_i the fraction of the T·k assignments given to expert i before drops. For k = 1 that is Switch's f_i; for any k
  it is DeepSpeed's `topkgating` l_aux (mean(me · ce) · N² / k). Uniform routing gives coef · 1.

Expert parallelism shards the stacked weights on dim 0 (the expert); exercise 09 writes the dispatch and combine
of exactly `route` and `run_experts` across ranks.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

__all__ = ["MoEConfig", "Routing", "route", "run_experts", "expert_capacity", "load_balancing_loss",
           "GroupedExperts", "MoE", "moe_param_std", "fill_seeded_"]


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True)
class MoEConfig:
    """How a block's MLP becomes a mixture of experts. capacity_factor None: dropless. aux_loss_coef: α of the
    Switch loss (Switch used 10⁻², §2.2; quoted from memory, not re-read)."""

    n_experts: int = 4
    top_k: int = 2
    capacity_factor: float | None = None
    aux_loss_coef: float = 0.01

    def __post_init__(self):
        _positive_int(self.n_experts, "n_experts")
        _positive_int(self.top_k, "top_k")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must be at most n_experts ({self.n_experts}): a token picks "
                             f"distinct experts")
        factor = self.capacity_factor
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                                   or not math.isfinite(factor) or factor <= 0):
            raise ValueError(f"capacity_factor must be a positive number (1.0-1.25 is usual) or None for dropless, "
                             f"got {factor!r}")
        coef = self.aux_loss_coef
        if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not math.isfinite(coef) or coef < 0:
            raise ValueError(f"aux_loss_coef must be a number >= 0 (0 turns the loss off), got {coef!r}")


def expert_capacity(tokens: int, n_experts: int, top_k: int, capacity_factor: float | None) -> int | None:
    """The most assignments one expert takes: ceil(capacity_factor · tokens · top_k / n_experts); None: dropless."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * tokens * top_k / n_experts)


@dataclass
class Routing:
    """Where each of T tokens goes. experts, gates, kept: (T, top_k), a token's choices best first; gates sum to 1
    over a token's k (kept or not) and are in the autograd graph; probs (T, n_experts) the router's softmax;
    tokens_per_expert (n_experts,) int64, assignments before drops; capacity None when dropless."""

    experts: torch.Tensor
    gates: torch.Tensor
    kept: torch.Tensor
    probs: torch.Tensor
    tokens_per_expert: torch.Tensor
    capacity: int | None


def route(logits: torch.Tensor, config: MoEConfig) -> Routing:
    """Token-choice top-k routing of router logits (T, n_experts), with capacity drops in token order."""
    tokens, n_experts = logits.shape
    if n_experts != config.n_experts:
        raise ValueError(f"logits have {n_experts} experts, the config {config.n_experts}")
    probs = F.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)  # float32 at least
    top, experts = probs.topk(config.top_k, dim=-1)
    gates = top / top.sum(dim=-1, keepdim=True)
    tokens_per_expert = torch.bincount(experts.flatten(), minlength=n_experts)
    capacity = expert_capacity(tokens, n_experts, config.top_k, config.capacity_factor)
    if capacity is None:
        kept = torch.ones_like(experts, dtype=torch.bool)
    else:
        # Assignments in token order (token 0's k choices, then token 1's, ...): an assignment's place in its
        # expert's queue is the number of earlier assignments to the same expert.
        chosen = F.one_hot(experts.flatten(), n_experts)
        place = (chosen.cumsum(dim=0) - 1).gather(1, experts.flatten()[:, None]).view_as(experts)
        kept = place < capacity
    return Routing(experts, gates, kept, probs, tokens_per_expert, capacity)


def run_experts(x: torch.Tensor, routing: Routing, w1: torch.Tensor, w2: torch.Tensor,
                w3: torch.Tensor) -> torch.Tensor:
    """Each expert e computes w2[e](silu(w1[e] x) * w3[e] x) on the tokens it kept; outputs are weighted by their
    gates and summed back per token (a token with nothing kept gets zeros). x: (T, dim); w1, w3: (E, hidden, dim);
    w2: (E, dim, hidden)."""
    top_k = routing.experts.shape[1]
    token_of = torch.arange(x.shape[0], device=x.device).repeat_interleave(top_k)
    expert_of, gate_of = routing.experts.flatten(), routing.gates.flatten().to(x.dtype)
    kept = routing.kept.flatten()
    out = torch.zeros_like(x)
    for e in range(w1.shape[0]):
        rows = torch.nonzero(kept & (expert_of == e)).flatten()
        if rows.numel() == 0:
            continue
        tokens = token_of[rows]
        h = F.silu(x[tokens] @ w1[e].T) * (x[tokens] @ w3[e].T)
        out = out.index_add(0, tokens, (h @ w2[e].T) * gate_of[rows, None])
    return out


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor, coef: float) -> torch.Tensor:
    """coef · N · Σ_i f_i · P_i (Switch §2.2) from the router's probs (T, N) and the chosen experts (T, k): f_i the
    share of the T·k assignments given to expert i (before drops, no gradient), P_i the mean router probability of
    expert i (differentiable)."""
    n_experts = probs.shape[1]
    f = torch.bincount(experts.flatten(), minlength=n_experts).to(probs.dtype) / experts.numel()
    return coef * n_experts * (f * probs.mean(dim=0)).sum()


def fill_seeded_(param: torch.Tensor, key: str, seed: int, std: float,
                 bounds: tuple[float, float] | None = (-2.0, 2.0)) -> None:
    """Fill `param` with N(0, std²), truncated to `bounds` (absolute, like nn.init.trunc_normal_'s a and b; None:
    not truncated), drawn in float32 on the CPU from a generator seeded by sha256(seed, key). The values depend on
    the key and the seed only: not on which other parameters a rank holds, nor the order they are filled in. A
    DTensor gets its own shard of the full tensor (distribute_tensor with src_data_rank=None: no communication),
    never DTensor's random ops, which a CPU mesh gets wrong (research §4.5)."""
    digest = hashlib.sha256(f"{seed}/{key}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    full = torch.empty(tuple(param.shape), dtype=torch.float32, device="cpu")  # the generator is a CPU one
    if bounds is None:
        nn.init.normal_(full, std=std, generator=generator)
    else:
        nn.init.trunc_normal_(full, std=std, a=bounds[0], b=bounds[1], generator=generator)
    with torch.no_grad():
        if isinstance(param, DTensor):
            param.copy_(distribute_tensor(full.to(param.dtype), param.device_mesh, param.placements,
                                          src_data_rank=None))
        elif not param.is_meta:
            param.copy_(full.to(param.dtype))


class GroupedExperts(nn.Module):
    """The experts' SwiGLU weights stacked with the expert as dim 0, torchtitan's `GroupedExperts` layout
    (torchtitan/models/moe/moe.py @003edbe5): w1, w3 (E, hidden, dim), w2 (E, dim, hidden). (Its earlier
    experiments/llama4 version stored them transposed, (E, dim, hidden).)"""

    def __init__(self, dim: int, hidden: int, n_experts: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(n_experts, hidden, dim))


def moe_param_std(name: str, init_std: float) -> float:
    """torchtitan's std for a MoE parameter named within the MoE: the router and w2, w3 `init_std`, w1 0.02
    (`GroupedExperts.init_weights`, `TokenChoiceTopKRouter.init_weights`, torchtitan/models/moe/moe.py @003edbe5)."""
    return 0.02 if name == "experts.w1" else init_std


class MoE(nn.Module):
    """A mixture-of-experts MLP on (..., dim) inputs. After each forward: `aux_loss` (a scalar in the graph: add it
    to the training loss), `tokens_per_expert` (int64, assignments before drops), `dropped` (assignments over
    capacity, an int), `routing` (the last Routing)."""

    def __init__(self, dim: int, hidden: int, config: MoEConfig):
        super().__init__()
        if not isinstance(config, MoEConfig):
            raise ValueError(f"config must be a MoEConfig, got {type(config).__name__}")
        self.config = config
        self.router = nn.Linear(dim, config.n_experts, bias=False)
        self.experts = GroupedExperts(dim, hidden, config.n_experts)
        self.aux_loss: torch.Tensor | None = None
        self.tokens_per_expert: torch.Tensor | None = None
        self.dropped: int | None = None
        self.routing: Routing | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        routing = route(self.router(flat), self.config)
        out = run_experts(flat, routing, self.experts.w1, self.experts.w2, self.experts.w3)
        self.aux_loss = load_balancing_loss(routing.probs, routing.experts, self.config.aux_loss_coef)
        self.tokens_per_expert, self.dropped = routing.tokens_per_expert, int((~routing.kept).sum())
        self.routing = routing
        return out.view(x.shape)

    def init_weights(self, seed: int = 0, init_std: float = 0.02) -> None:
        """torchtitan's init (moe_param_std), each parameter from its own seeded generator (fill_seeded_)."""
        for name, param in self.named_parameters():
            fill_seeded_(param, name, seed, moe_param_std(name, init_std))
