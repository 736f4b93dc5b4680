"""Takes its block by the global rank modulo the group's size: right for groups of ranks 0-1 and 2-3, wrong for ranks 1-2."""

LOSES = ["test_tp_mlp_with_residuals_branches_and_subgroups"]


def _block(size, group, name):
    world_size = dist.get_world_size(group)
    rank = dist.get_rank() % world_size  # the rank in the group only when the group's ranks start at a multiple of its size
    if size % world_size:
        raise ValueError(f"{name} is {size}, not divisible by the group's world size {world_size}")
    per_rank = size // world_size
    return rank * per_rank, (rank + 1) * per_rank
