"""Broadcasts the whole weight from rank 0 before slicing (DDP's habit): communication every rank can do without."""

LOSES = ["test_parallel_linears_keep_only_their_shard", "test_megatron_mlp_all_reduces_once_each_way"]


class ColumnParallelLinear(ColumnParallelLinear):  # noqa: F811
    def __init__(self, linear, group=None):
        nn.Module.__init__(self)
        start, stop = _block(linear.out_features, group, "out_features")
        self.group = group
        weight = linear.weight.detach().clone()
        source = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast(weight, src=source, group=group)
        self.weight = nn.Parameter(weight[start:stop].clone())
        if linear.bias is not None:
            bias = linear.bias.detach().clone()
            dist.broadcast(bias, src=source, group=group)
            self.bias = nn.Parameter(bias[start:stop].clone())
        else:
            self.bias = None
