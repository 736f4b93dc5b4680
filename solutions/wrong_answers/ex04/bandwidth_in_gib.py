"""Reports bandwidth in GiB/s (2**30 bytes per second) where nccl-tests prints GB/s (10**9)."""

LOSES = ["test_bandwidths_follow_nccl_tests"]


def bandwidths(collective, size_bytes, seconds, world_size):
    if seconds <= 0 or size_bytes < 0:
        raise ValueError("need seconds > 0 and size_bytes >= 0")
    algbw = size_bytes / seconds / 2**30
    return algbw, algbw * bus_bandwidth_factor(collective, world_size)
