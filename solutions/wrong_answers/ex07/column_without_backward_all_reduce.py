"""ColumnParallelLinear is a plain F.linear on its rows: the input's gradient is only this rank's part, never summed."""

LOSES = ["test_column_parallel_linear_matches_nn_linear", "test_megatron_mlp_all_reduces_once_each_way"]


class ColumnParallelLinear(ColumnParallelLinear):  # noqa: F811
    def forward(self, x):
        return F.linear(x, self.weight, self.bias)
