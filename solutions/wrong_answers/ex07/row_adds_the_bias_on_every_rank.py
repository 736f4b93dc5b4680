"""Adds the bias on every rank before the all-reduce: the output carries world_size times the bias."""

LOSES = ["test_row_parallel_linear_matches_nn_linear", "test_megatron_mlp_all_reduces_once_each_way"]


class RowParallelLinear(RowParallelLinear):  # noqa: F811
    def forward(self, x):
        return _AllReduceInForward.apply(F.linear(x, self.weight, self.bias), self.group)
