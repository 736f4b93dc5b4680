"""RowParallelLinear all-reduces in backward as well (the sum's backward taken as a sum): gradients world_size times too big, twice the traffic."""

LOSES = ["test_row_parallel_linear_matches_nn_linear", "test_megatron_mlp_all_reduces_once_each_way"]


class _SumBothWays(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, group):
        ctx.group = group
        total = partial.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class RowParallelLinear(RowParallelLinear):  # noqa: F811
    def forward(self, x):
        total = _SumBothWays.apply(F.linear(x, self.weight), self.group)
        return total + self.bias if self.bias is not None else total
