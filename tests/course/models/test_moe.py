"""course_lib.models.moe: the MoE MLP against a loop over tokens written here (gates, capacity drops, aux loss)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from course_lib.models import MoE, MoEConfig, expert_capacity, route


def _moe(dim, hidden, config, seed=0):
    moe = MoE(dim, hidden, config).double()
    moe.init_weights(seed=seed, init_std=0.3)  # larger than torchtitan's 0.02, so that outputs differ visibly
    return moe


def _reference(moe: MoE, x: torch.Tensor):
    """Token by token, in plain Python: softmax, the top k by probability, gates renormalised over the k, each
    expert taking assignments in token order until it holds ceil(cf · T · k / E), dropped ones adding nothing;
    the loss coef · E · Σ_i f_i · P_i with f_i = (assignments to i) / (T · k), P_i = mean probability of i."""
    cfg, (tokens, dim) = moe.config, x.shape
    w_router = moe.router.weight.detach()
    w1, w2, w3 = (w.detach() for w in (moe.experts.w1, moe.experts.w2, moe.experts.w3))
    capacity = math.inf if cfg.capacity_factor is None else math.ceil(
        cfg.capacity_factor * tokens * cfg.top_k / cfg.n_experts)
    taken, counts, dropped = [0] * cfg.n_experts, [0] * cfg.n_experts, 0
    prob_sums = [0.0] * cfg.n_experts
    out = torch.zeros(tokens, dim, dtype=x.dtype)
    for t in range(tokens):
        logits = [float(w_router[e] @ x[t]) for e in range(cfg.n_experts)]
        top = max(logits)
        exps = [math.exp(v - top) for v in logits]
        probs = [v / sum(exps) for v in exps]
        prob_sums = [s + p for s, p in zip(prob_sums, probs)]
        chosen = sorted(range(cfg.n_experts), key=lambda e: -probs[e])[:cfg.top_k]
        for e in chosen:
            counts[e] += 1
            if taken[e] >= capacity:
                dropped += 1
                continue
            taken[e] += 1
            gate = probs[e] / sum(probs[c] for c in chosen)
            hidden = torch.nn.functional.silu(w1[e] @ x[t]) * (w3[e] @ x[t])
            out[t] += gate * (w2[e] @ hidden)
    f = [c / (tokens * cfg.top_k) for c in counts]
    aux = cfg.aux_loss_coef * cfg.n_experts * sum(fi * s / tokens for fi, s in zip(f, prob_sums))
    return out, counts, dropped, aux


def _check(tokens, n_experts, top_k, capacity_factor, seed, dim=6, hidden=5):
    moe = _moe(dim, hidden, MoEConfig(n_experts, top_k, capacity_factor, aux_loss_coef=0.01), seed)
    x = torch.randn(tokens, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    out = moe(x)
    expected, counts, dropped, aux = _reference(moe, x)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-10)
    assert moe.tokens_per_expert.dtype == torch.int64 and moe.tokens_per_expert.tolist() == counts
    assert moe.dropped == dropped and isinstance(moe.dropped, int)
    assert moe.aux_loss.item() == pytest.approx(aux, rel=1e-12) and moe.aux_loss.requires_grad
    return moe, x, dropped


@settings(max_examples=25)
@given(tokens=st.integers(1, 24), n_experts=st.integers(1, 6), top_k=st.integers(1, 6), seed=st.integers(0, 2**16),
       capacity_factor=st.one_of(st.none(), st.floats(0.1, 2.0)))
@example(tokens=16, n_experts=4, top_k=2, seed=1, capacity_factor=0.5)
def test_moe_matches_a_token_by_token_reference(tokens, n_experts, top_k, seed, capacity_factor):
    _, _, dropped = _check(tokens, n_experts, min(top_k, n_experts), capacity_factor, seed)
    if capacity_factor is None:
        assert dropped == 0


def test_drops_follow_token_order_and_a_token_with_nothing_kept_gets_zeros():
    moe = _moe(4, 3, MoEConfig(n_experts=2, top_k=1, capacity_factor=0.5))  # capacity ceil(0.5·6·1/2) = 2
    with torch.no_grad():
        moe.router.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [-1.0, 0, 0, 0]], dtype=torch.float64))
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x[:, 0] = 1.0  # every token prefers expert 0: tokens 0 and 1 are kept, 2..5 dropped
    out = moe(x)
    assert moe.routing.capacity == 2 and moe.routing.kept.flatten().tolist() == [True] * 2 + [False] * 4
    assert moe.dropped == 4 and moe.tokens_per_expert.tolist() == [6, 0]
    assert out[:2].abs().sum() > 0 and torch.equal(out[2:], torch.zeros(4, 4, dtype=torch.float64))


def test_gates_sum_to_one_over_the_k_chosen_and_gradients_reach_router_and_experts():
    moe, x, _ = _check(10, 4, 2, None, seed=3)
    gates = moe.routing.gates
    torch.testing.assert_close(gates.sum(-1), torch.ones(10, dtype=torch.float64))
    assert (moe.routing.probs.gather(1, moe.routing.experts) >= moe.routing.probs.topk(3, -1).values[:, 2:]).all()
    (moe(x).sum() + moe.aux_loss).backward()
    for name, p in moe.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_uniform_router_gives_the_loss_its_coefficient():
    moe = _moe(5, 4, MoEConfig(n_experts=4, top_k=2, aux_loss_coef=0.05))
    with torch.no_grad():
        moe.router.weight.zero_()
    moe(torch.randn(7, 5, dtype=torch.float64))
    assert moe.aux_loss.item() == pytest.approx(0.05)  # P_i = 1/N whatever f is: coef · N · Σ f_i / N


def test_layout_init_and_capacity():
    moe = MoE(8, 6, MoEConfig(n_experts=3, top_k=1))
    assert moe.router.weight.shape == (3, 8) and moe.router.bias is None
    assert (moe.experts.w1.shape, moe.experts.w2.shape, moe.experts.w3.shape) == ((3, 6, 8), (3, 8, 6), (3, 6, 8))
    moe.init_weights(seed=1)
    again = MoE(8, 6, MoEConfig(n_experts=3, top_k=1))
    again.init_weights(seed=1)
    assert all(torch.equal(p, q) for p, q in zip(moe.parameters(), again.parameters()))
    assert moe.experts.w1.std().item() == pytest.approx(0.02, rel=0.4)
    assert expert_capacity(8, 4, 1, 1.0) == 2 and expert_capacity(10, 4, 2, 1.25) == 7
    assert expert_capacity(10, 4, 2, None) is None
    out = moe(torch.randn(2, 3, 8))  # any leading shape
    assert out.shape == (2, 3, 8) and moe.tokens_per_expert.sum() == 6


@pytest.mark.parametrize("changes, message", [
    (dict(n_experts=0), "n_experts"), (dict(top_k=5), "at most n_experts"), (dict(top_k=1.0), "top_k"),
    (dict(capacity_factor=0), "capacity_factor"), (dict(capacity_factor=float("inf")), "capacity_factor"),
    (dict(aux_loss_coef=-1), "aux_loss_coef"),
])
def test_config_errors_say_what_to_change(changes, message):
    with pytest.raises(ValueError, match=message):
        MoEConfig(**changes)
    with pytest.raises(ValueError, match="MoEConfig"):
        MoE(4, 4, {"n_experts": 2})
    with pytest.raises(ValueError, match="experts"):
        route(torch.zeros(3, 5), MoEConfig(n_experts=4))
