"""All-gathers every rank's k and v and attends over the whole sequence: right values, but no ring."""

LOSES = ["test_ring_attention_passes_blocks_around_the_ring"]


def ring_attention(q, k, v, *, group=None, causal=True):
    _check_attention_inputs(q, k, v)
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    keys = [torch.empty_like(k.contiguous()) for _ in range(n)]
    values = [torch.empty_like(v.contiguous()) for _ in range(n)]
    dist.all_gather(keys, k.contiguous(), group=group)
    dist.all_gather(values, v.contiguous(), group=group)
    accumulate = torch.promote_types(q.dtype, torch.float32)
    chunk = q.shape[2]
    scores = q.to(accumulate) @ torch.cat(keys, dim=2).to(accumulate).transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        rows = torch.arange(chunk)[:, None] + rank * chunk
        scores = scores.masked_fill(torch.arange(n * chunk)[None, :] > rows, -math.inf)
    return (torch.softmax(scores, dim=-1) @ torch.cat(values, dim=2).to(accumulate)).to(q.dtype)
