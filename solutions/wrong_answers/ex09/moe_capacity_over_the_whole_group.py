"""Applies the capacity to an expert's assignments from all ranks together (earlier ranks first), not per rank."""

LOSES = ["test_moe_dispatch_and_combine_match_one_process", "test_moe_exchanges_counts_then_only_the_kept_tokens"]


def moe_dispatch(x, expert_ids, gates, *, n_experts, capacity, group=None):
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    _check_routing(x, expert_ids, gates, n_experts, capacity, ep)
    tokens, k = expert_ids.shape
    local = n_experts // ep
    flat = expert_ids.reshape(-1).long()
    mine = torch.bincount(flat, minlength=n_experts)
    everyone = [torch.empty_like(mine) for _ in range(ep)]
    dist.all_gather(everyone, mine, group=group)
    before = sum(everyone[:rank], torch.zeros_like(mine))  # the assignments of earlier ranks, per expert
    one_hot = torch.nn.functional.one_hot(flat, n_experts)
    place = (one_hot.cumsum(0) * one_hot).sum(1) - 1 + before[flat]
    kept = place < capacity
    order = torch.nonzero(kept).flatten()
    order = order[torch.sort(flat[order], stable=True).indices]
    counts = torch.bincount(flat[order], minlength=n_experts)
    send_splits = counts.reshape(ep, local).sum(1).tolist()
    arrived_counts = torch.empty_like(counts)
    dist.all_to_all_single(arrived_counts, counts, group=group)
    arrived_counts = arrived_counts.reshape(ep, local)
    recv_splits = arrived_counts.sum(1).tolist()
    arrived = x.new_empty((sum(recv_splits), x.shape[1]))
    dist.all_to_all_single(arrived, x[order // k].contiguous(), output_split_sizes=recv_splits,
                           input_split_sizes=send_splits, group=group)
    expert_of_row = torch.repeat_interleave(torch.arange(local).repeat(ep), arrived_counts.reshape(-1))
    regroup = torch.sort(expert_of_row, stable=True).indices
    plan = DispatchPlan(kept.reshape(tokens, k), order, send_splits, recv_splits, regroup, gates)
    return arrived[regroup], arrived_counts.sum(0).tolist(), plan
