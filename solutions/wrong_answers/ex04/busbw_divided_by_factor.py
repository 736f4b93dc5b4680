"""Divides algorithm bandwidth by the factor instead of multiplying: busbw = algbw / (2(n-1)/n)."""

LOSES = ["test_bandwidths_follow_nccl_tests"]


def bandwidths(collective, size_bytes, seconds, world_size):
    if seconds <= 0 or size_bytes < 0:
        raise ValueError("need seconds > 0 and size_bytes >= 0")
    algbw = size_bytes / seconds / 1e9
    factor = bus_bandwidth_factor(collective, world_size)
    return algbw, algbw / factor if factor else 0.0
