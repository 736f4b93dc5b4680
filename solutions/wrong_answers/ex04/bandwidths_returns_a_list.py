"""Returns the two bandwidths as a list [algbw, busbw], where the docstring promises a tuple of two floats."""

LOSES = ["test_bandwidths_follow_nccl_tests"]


def bandwidths(collective, size_bytes, seconds, world_size):
    if seconds <= 0 or size_bytes < 0:
        raise ValueError("need seconds > 0 and size_bytes >= 0")
    algbw = size_bytes / seconds / 1e9
    return [algbw, algbw * bus_bandwidth_factor(collective, world_size)]
