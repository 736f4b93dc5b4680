"""Returns the last item's index as stop, (0, 2) for items 0, 1, 2: an inclusive end where a half-open range is asked."""

LOSES = ["test_shard_range_matches_tensor_split"]


def shard_range(num_items, world_size, rank):
    if world_size < 1 or not 0 <= rank < world_size or num_items < 0:
        raise ValueError("need world_size >= 1, 0 <= rank < world_size and num_items >= 0")
    base, extra = divmod(num_items, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0) - 1
