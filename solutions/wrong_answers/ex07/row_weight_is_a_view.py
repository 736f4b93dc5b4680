"""Wraps a view of the nn.Linear's weight in nn.Parameter: the full weight stays alive through the view."""

LOSES = ["test_parallel_linears_keep_only_their_shard"]


class RowParallelLinear(RowParallelLinear):  # noqa: F811
    def __init__(self, linear, group=None):
        nn.Module.__init__(self)
        start, stop = _block(linear.in_features, group, "in_features")
        self.group = group
        self.weight = nn.Parameter(linear.weight.detach()[:, start:stop])
        self.bias = nn.Parameter(linear.bias.detach()) if linear.bias is not None else None
