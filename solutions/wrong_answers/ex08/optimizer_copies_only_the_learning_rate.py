"""Copies only each group's lr into the inner optimizer before its step: a changed weight_decay or momentum is ignored."""

LOSES = ["test_sharded_optimizer_follows_schedules_groups_and_closures"]


class ShardedOptimizer(ShardedOptimizer):  # noqa: F811
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for outer, inner in zip(self.param_groups, self.optimizer.param_groups):
            inner["lr"] = outer["lr"]
        self.optimizer.step()
        seen = set()
        for group in self.param_groups:
            for param in group["params"]:
                if id(param) not in seen:
                    seen.add(id(param))
                    dist.broadcast(param.data, src=self._owner[id(param)])
        return loss
