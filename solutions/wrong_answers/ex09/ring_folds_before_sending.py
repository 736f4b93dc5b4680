"""Folds the held block in, then passes it on and waits: right values, but no overlap of transfer and compute."""

LOSES = ["test_ring_attention_passes_blocks_around_the_ring"]


def ring_attention(q, k, v, *, group=None, causal=True):
    _check_attention_inputs(q, k, v)
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    accumulate = torch.promote_types(q.dtype, torch.float32)
    scaled_q = q.to(accumulate) / math.sqrt(q.shape[-1])
    running_max = torch.full(q.shape[:-1] + (1,), -math.inf, dtype=accumulate)
    total = torch.zeros(q.shape[:-1] + (1,), dtype=accumulate)
    out = torch.zeros(q.shape, dtype=accumulate)
    held = (k.contiguous(), v.contiguous())
    for step in range(n):
        source = (rank - step) % n
        pending, arriving = [], None
        if step < n - 1:
            arriving = (torch.empty_like(held[0]), torch.empty_like(held[1]))
            ops = [dist.P2POp(dist.isend, t, group=group, group_peer=(rank + 1) % n) for t in held]
            ops += [dist.P2POp(dist.irecv, t, group=group, group_peer=(rank - 1) % n) for t in arriving]
        if not (causal and source > rank):
            scores = scaled_q @ held[0].to(accumulate).transpose(-2, -1)
            if causal and source == rank:
                scores = scores.masked_fill(torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).triu(1), -math.inf)
            new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
            weights = torch.exp(scores - new_max)
            total = total * torch.exp(running_max - new_max) + weights.sum(dim=-1, keepdim=True)
            out = out * torch.exp(running_max - new_max) + weights @ held[1].to(accumulate)
            running_max = new_max
        if step < n - 1:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        if arriving is not None:
            held = arriving
    return (out / total).to(q.dtype)
