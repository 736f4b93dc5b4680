"""Gives every rank num_items // world_size items and the last rank the rest: 10 over 4 is 2, 2, 2, 4."""

LOSES = ["test_shard_range_matches_tensor_split"]


def shard_range(num_items, world_size, rank):
    if world_size < 1 or not 0 <= rank < world_size or num_items < 0:
        raise ValueError("need world_size >= 1, 0 <= rank < world_size and num_items >= 0")
    size = num_items // world_size
    start = rank * size
    return start, num_items if rank == world_size - 1 else start + size
