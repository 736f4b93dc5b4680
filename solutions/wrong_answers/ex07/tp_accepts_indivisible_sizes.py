"""Splits with floor division and no check: a size the world size does not divide loses its last rows or columns."""

LOSES = ["test_parallel_linears_reject_indivisible_sizes"]


def _block(size, group, name):
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    per_rank = size // world_size
    return rank * per_rank, (rank + 1) * per_rank
