"""Sends every assignment to its expert's owner, which drops the overflow: right outputs, but dropped tokens travel."""

LOSES = ["test_moe_exchanges_counts_then_only_the_kept_tokens"]

_solution_moe_dispatch = moe_dispatch


def moe_dispatch(x, expert_ids, gates, *, n_experts, capacity, group=None):
    ep = dist.get_world_size(group)
    _check_routing(x, expert_ids, gates, n_experts, capacity, ep)
    tokens, k = expert_ids.shape
    local = n_experts // ep
    flat = expert_ids.reshape(-1).long()
    one_hot = torch.nn.functional.one_hot(flat, n_experts)
    kept = ((one_hot.cumsum(0) * one_hot).sum(1) - 1) < capacity
    order = torch.sort(flat, stable=True).indices  # every assignment, by expert
    counts = torch.bincount(flat, minlength=n_experts)
    send_splits = counts.reshape(ep, local).sum(1).tolist()
    arrived_counts = torch.empty_like(counts)
    dist.all_to_all_single(arrived_counts, counts, group=group)
    arrived_counts = arrived_counts.reshape(ep, local)
    recv_splits = arrived_counts.sum(1).tolist()
    arrived = x.new_empty((sum(recv_splits), x.shape[1]))
    dist.all_to_all_single(arrived, x[order // k].contiguous(), output_split_sizes=recv_splits,
                           input_split_sizes=send_splits, group=group)
    place = torch.cat([torch.arange(int(c)) for c in arrived_counts.reshape(-1)] + [torch.zeros(0, dtype=torch.long)])
    expert_of_row = torch.repeat_interleave(torch.arange(local).repeat(ep), arrived_counts.reshape(-1))
    rows = torch.nonzero(place < capacity).flatten()
    regroup = rows[torch.sort(expert_of_row[rows], stable=True).indices]
    plan = DispatchPlan(kept.reshape(tokens, k), order, send_splits, recv_splits, regroup, gates)
    return arrived[regroup], arrived_counts.clamp(max=capacity).sum(0).tolist(), plan


def moe_combine(expert_out, plan, *, group=None):
    arrived = expert_out.new_zeros((sum(plan.recv_splits), expert_out.shape[1]))
    arrived[plan.regroup] = expert_out
    back = expert_out.new_empty((len(plan.order), expert_out.shape[1]))
    dist.all_to_all_single(back, arrived, output_split_sizes=plan.send_splits, input_split_sizes=plan.recv_splits,
                           group=group)
    tokens, k = plan.kept.shape
    weights = (plan.gates.reshape(-1) * plan.kept.reshape(-1))[plan.order].to(expert_out.dtype)
    out = expert_out.new_zeros((tokens, expert_out.shape[1]))
    return out.index_add_(0, plan.order // k, back * weights[:, None])
