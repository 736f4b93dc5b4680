"""Sums x's gradient with a hook on x instead of in an autograd Function: right while x has no other use, wrong for x + mlp(x)."""

LOSES = ["test_tp_mlp_with_residuals_branches_and_subgroups"]


class ColumnParallelLinear(ColumnParallelLinear):  # noqa: F811
    def forward(self, x):
        if x.requires_grad:
            def summed(grad):  # x's WHOLE gradient: its other uses' parts are summed over the group too
                grad = grad.clone(memory_format=torch.contiguous_format)
                dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=self.group)
                return grad

            x.register_hook(summed)
        return F.linear(x, self.weight, self.bias)
