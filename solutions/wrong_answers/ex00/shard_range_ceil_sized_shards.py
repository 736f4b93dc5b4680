"""Gives every rank ceil(num_items / world_size) items until they run out: 10 over 4 is 3, 3, 3, 1, not 3, 3, 2, 2."""

LOSES = ["test_shard_range_matches_tensor_split"]


def shard_range(num_items, world_size, rank):
    if world_size < 1 or not 0 <= rank < world_size or num_items < 0:
        raise ValueError("need world_size >= 1, 0 <= rank < world_size and num_items >= 0")
    size = -(-num_items // world_size)
    start = min(rank * size, num_items)
    return start, min(start + size, num_items)
