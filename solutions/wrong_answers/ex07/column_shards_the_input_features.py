"""ColumnParallelLinear keeps a block of the weight's columns (input features) instead of its rows."""

LOSES = ["test_column_parallel_linear_matches_nn_linear", "test_megatron_mlp_all_reduces_once_each_way"]


class ColumnParallelLinear(ColumnParallelLinear):  # noqa: F811
    def __init__(self, linear, group=None):
        nn.Module.__init__(self)
        start, stop = _block(linear.out_features, group, "out_features")
        per_rank = linear.in_features // dist.get_world_size(group)
        rank = dist.get_rank(group)
        self.group = group
        self.weight = nn.Parameter(linear.weight.detach()[:, rank * per_rank:(rank + 1) * per_rank].clone())
        self.bias = nn.Parameter(linear.bias.detach()[start:stop].clone()) if linear.bias is not None else None

    def forward(self, x):
        per_rank = self.weight.shape[1]
        rank = dist.get_rank(self.group)
        x = _AllReduceInBackward.apply(x, self.group)[..., rank * per_rank:(rank + 1) * per_rank]
        return F.linear(x, self.weight, self.bias)
