"""Returns (0, 0) at once when there are no items, before checking the arguments: rank 5 of 2 gets a range."""

LOSES = ["test_shard_range_rejects_bad_input"]


def shard_range(num_items, world_size, rank):
    if num_items == 0:
        return 0, 0  # nothing to split
    if world_size < 1 or not 0 <= rank < world_size or num_items < 0:
        raise ValueError("need world_size >= 1, 0 <= rank < world_size and num_items >= 0")
    base, extra = divmod(num_items, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)
