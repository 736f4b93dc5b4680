"""Returns the cut points (the first layer of each stage after the first) instead of the lists of layers."""

LOSES = ["test_partition_minimises_the_costliest_stage", "test_partition_returns_contiguous_stages"]

_solution_partition = partition


def partition(costs, stages):
    return [group[0] for group in _solution_partition(costs, stages)[1:]]
