"""Computes the range without checking the arguments: world_size 0 raises ZeroDivisionError, a negative rank returns."""

LOSES = ["test_shard_range_rejects_bad_input"]


def shard_range(num_items, world_size, rank):
    base, extra = divmod(num_items, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)
