"""Returns (0.0, 0.0) for an empty message before any check: a zero world size or an unknown name passes."""

LOSES = ["test_bandwidths_reject_bad_input"]

_bandwidths = bandwidths


def bandwidths(collective, size_bytes, seconds, world_size):
    if size_bytes == 0:
        return 0.0, 0.0
    return _bandwidths(collective, size_bytes, seconds, world_size)
