"""Converts the costs to floats in place: the caller's list changes, and a tuple cannot be changed at all."""

LOSES = ["test_partition_returns_contiguous_stages"]

_solution_partition = partition


def partition(costs, stages):
    for i, cost in enumerate(costs):
        if isinstance(cost, int) and not isinstance(cost, bool):
            costs[i] = float(cost)
    return _solution_partition(costs, stages)
