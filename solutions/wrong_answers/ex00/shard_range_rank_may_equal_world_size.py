"""Checks 0 <= rank <= world_size (off by one), so rank == world_size gets an empty range instead of ValueError."""

LOSES = ["test_shard_range_rejects_bad_input"]


def shard_range(num_items, world_size, rank):
    if world_size < 1 or not 0 <= rank <= world_size or num_items < 0:
        raise ValueError("need world_size >= 1, 0 <= rank < world_size and num_items >= 0")
    base, extra = divmod(num_items, world_size)
    start = rank * base + min(rank, extra)
    stop = start + base + (1 if rank < extra else 0)
    return min(start, num_items), min(stop, num_items)
