"""RowParallelLinear slices the weight's rows (output features), as the column layer does, not its columns."""

LOSES = ["test_row_parallel_linear_matches_nn_linear"]


class RowParallelLinear(RowParallelLinear):  # noqa: F811
    def __init__(self, linear, group=None):
        nn.Module.__init__(self)
        start, stop = _block(linear.in_features, group, "in_features")
        self.group = group
        self.weight = nn.Parameter(linear.weight.detach()[start:stop].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None
