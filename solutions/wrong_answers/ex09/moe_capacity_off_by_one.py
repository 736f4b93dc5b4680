"""Keeps capacity + 1 assignments per expert: `place <= capacity` where the first place is 0."""

LOSES = ["test_moe_dispatch_and_combine_match_one_process"]

_solution_moe_dispatch = moe_dispatch


def moe_dispatch(x, expert_ids, gates, *, n_experts, capacity, group=None):
    return _solution_moe_dispatch(x, expert_ids, gates, n_experts=n_experts, capacity=capacity + 1, group=group)
