"""Gives broadcast and reduce the factor (n-1)/n (as if the root kept a share) where nccl-tests uses 1."""

LOSES = ["test_bus_bandwidth_factor_table", "test_bandwidths_follow_nccl_tests"]


def bus_bandwidth_factor(collective, world_size):
    if world_size < 1:
        raise ValueError("world_size must be at least 1")
    n = world_size
    factors = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n,
               "all_to_all": (n - 1) / n, "broadcast": (n - 1) / n, "reduce": (n - 1) / n}
    if collective not in factors:
        raise ValueError(f"unknown collective {collective!r}")
    return factors[collective]
