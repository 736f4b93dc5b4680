"""Computes the bandwidths without checking the inputs: a zero or negative time gives nonsense, not ValueError."""

LOSES = ["test_bandwidths_reject_bad_input"]


def bandwidths(collective, size_bytes, seconds, world_size):
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * bus_bandwidth_factor(collective, world_size)
