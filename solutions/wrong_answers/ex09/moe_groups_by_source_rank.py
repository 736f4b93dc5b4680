"""Returns the tokens in the order they arrived (by source rank, then expert) without regrouping them by expert."""

LOSES = ["test_moe_dispatch_and_combine_match_one_process"]

_solution_moe_dispatch = moe_dispatch


def moe_dispatch(x, expert_ids, gates, *, n_experts, capacity, group=None):
    received, counts, plan = _solution_moe_dispatch(x, expert_ids, gates, n_experts=n_experts, capacity=capacity,
                                                    group=group)
    arrived = torch.empty_like(received)
    arrived[plan.regroup] = received
    return arrived, counts, plan._replace(regroup=torch.arange(len(plan.regroup)))
