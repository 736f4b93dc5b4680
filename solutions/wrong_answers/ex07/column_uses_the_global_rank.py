"""Takes its block by the global rank, dist.get_rank(), not the rank within the group it was given."""

LOSES = ["test_megatron_mlp_all_reduces_once_each_way"]


class ColumnParallelLinear(ColumnParallelLinear):  # noqa: F811
    def __init__(self, linear, group=None):
        nn.Module.__init__(self)
        world_size, rank = dist.get_world_size(group), dist.get_rank()
        if linear.out_features % world_size:
            raise ValueError(f"out_features {linear.out_features} is not divisible by {world_size}")
        per_rank = linear.out_features // world_size
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        self.group = group
        self.weight = nn.Parameter(linear.weight.detach()[rows].clone())
        self.bias = nn.Parameter(linear.bias.detach()[rows].clone()) if linear.bias is not None else None
