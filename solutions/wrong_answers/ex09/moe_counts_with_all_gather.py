"""Shares the per-expert counts with an all_gather of every rank's counts instead of a tiny all_to_all."""

LOSES = ["test_moe_exchanges_counts_then_only_the_kept_tokens"]


def moe_dispatch(x, expert_ids, gates, *, n_experts, capacity, group=None):
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    _check_routing(x, expert_ids, gates, n_experts, capacity, ep)
    tokens, k = expert_ids.shape
    local = n_experts // ep
    flat = expert_ids.reshape(-1).long()
    one_hot = torch.nn.functional.one_hot(flat, n_experts)
    place = (one_hot.cumsum(0) * one_hot).sum(1) - 1
    kept = place < capacity
    order = torch.nonzero(kept).flatten()
    order = order[torch.sort(flat[order], stable=True).indices]
    counts = torch.bincount(flat[order], minlength=n_experts)
    send_splits = counts.reshape(ep, local).sum(1).tolist()
    everyone = [torch.empty_like(counts) for _ in range(ep)]
    dist.all_gather(everyone, counts, group=group)  # every rank's counts for every expert
    arrived_counts = torch.stack([c[rank * local:(rank + 1) * local] for c in everyone])
    recv_splits = arrived_counts.sum(1).tolist()
    arrived = x.new_empty((sum(recv_splits), x.shape[1]))
    dist.all_to_all_single(arrived, x[order // k].contiguous(), output_split_sizes=recv_splits,
                           input_split_sizes=send_splits, group=group)
    expert_of_row = torch.repeat_interleave(torch.arange(local).repeat(ep), arrived_counts.reshape(-1))
    regroup = torch.sort(expert_of_row, stable=True).indices
    plan = DispatchPlan(kept.reshape(tokens, k), order, send_splits, recv_splits, regroup, gates)
    return arrived[regroup], arrived_counts.sum(0).tolist(), plan
