"""Uses all-reduce's factor 2(n-1)/n for every collective."""

LOSES = ["test_bus_bandwidth_factor_table", "test_bandwidths_follow_nccl_tests"]


def bus_bandwidth_factor(collective, world_size):
    known = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce"}
    if world_size < 1 or collective not in known:
        raise ValueError(f"unknown collective {collective!r} or world_size < 1")
    return 2 * (world_size - 1) / world_size
