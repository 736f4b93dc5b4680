"""Returns (0, num_items) at once when there is one rank, before checking the arguments: rank 1 of 1 gets a range."""

LOSES = ["test_shard_range_rejects_bad_input"]


def shard_range(num_items, world_size, rank):
    if world_size == 1:
        return 0, num_items  # one rank owns everything
    if world_size < 1 or not 0 <= rank < world_size or num_items < 0:
        raise ValueError("need world_size >= 1, 0 <= rank < world_size and num_items >= 0")
    base, extra = divmod(num_items, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)
