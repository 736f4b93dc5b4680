"""Returns the float32 accumulator as it is: bfloat16 inputs give a float32 result."""

LOSES = ["test_ring_attention_matches_full_attention"]

_solution_ring_attention = ring_attention


def ring_attention(q, k, v, *, group=None, causal=True):
    return _solution_ring_attention(q.float(), k.float(), v.float(), group=group, causal=causal) \
        if q.dtype == torch.bfloat16 else _solution_ring_attention(q, k, v, group=group, causal=causal)
