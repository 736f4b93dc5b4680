"""Broadcasts every parameter from rank 0, whether rank 0 owns it or not."""

LOSES = ["test_sharded_optimizer_matches_the_unsharded_optimizer"]


class ShardedOptimizer(ShardedOptimizer):  # noqa: F811
    @torch.no_grad()
    def step(self, closure=None):
        for outer, inner in zip(self.param_groups, self.optimizer.param_groups):
            for key, value in outer.items():
                if key != "params":
                    inner[key] = value
        self.optimizer.step()
        for group in self.param_groups:
            for param in group["params"]:
                dist.broadcast(param.data, src=0)
