"""Keeps the full weight as a buffer next to its block (to slice again later): no memory saved."""

LOSES = ["test_parallel_linears_keep_only_their_shard"]


class ColumnParallelLinear(ColumnParallelLinear):  # noqa: F811
    def __init__(self, linear, group=None):
        super().__init__(linear, group)
        self.register_buffer("full_weight", linear.weight.detach().clone())
