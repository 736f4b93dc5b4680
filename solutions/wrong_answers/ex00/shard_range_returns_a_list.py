"""Returns [start, stop], a list, where the docstring promises a tuple: the right numbers in the wrong type."""

LOSES = ["test_shard_range_matches_tensor_split"]


def shard_range(num_items, world_size, rank):
    if world_size < 1 or not 0 <= rank < world_size or num_items < 0:
        raise ValueError("need world_size >= 1, 0 <= rank < world_size and num_items >= 0")
    base, extra = divmod(num_items, world_size)
    start = rank * base + min(rank, extra)
    return [start, start + base + (1 if rank < extra else 0)]
