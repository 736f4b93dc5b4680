"""Calls step()'s closure inside the @torch.no_grad() step: the closure's backward finds no graph."""

LOSES = ["test_sharded_optimizer_follows_schedules_groups_and_closures"]


class ShardedOptimizer(ShardedOptimizer):  # noqa: F811
    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for outer, inner in zip(self.param_groups, self.optimizer.param_groups):
            for key, value in outer.items():
                if key != "params":
                    inner[key] = value
        self.optimizer.step()
        seen = set()
        for group in self.param_groups:
            for param in group["params"]:
                if id(param) not in seen:
                    seen.add(id(param))
                    dist.broadcast(param.data, src=self._owner[id(param)])
        return loss
