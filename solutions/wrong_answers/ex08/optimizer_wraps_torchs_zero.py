"""Wraps torch's ZeroRedundancyOptimizer instead of sharding by hand."""

LOSES = ["test_sharded_optimizer_matches_the_unsharded_optimizer"]

from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: E402


class ShardedOptimizer(ZeroRedundancyOptimizer):  # noqa: F811
    def __init__(self, params, optimizer_cls, **defaults):
        super().__init__(params, optimizer_class=optimizer_cls, **defaults)
