"""add_param_group after construction assigns owners but never adds the rank's share to the inner optimizer."""

LOSES = ["test_sharded_optimizer_follows_schedules_groups_and_closures"]


class ShardedOptimizer(ShardedOptimizer):  # noqa: F811
    def add_param_group(self, param_group):
        torch.optim.Optimizer.add_param_group(self, param_group)
        for param in self.param_groups[-1]["params"]:
            if id(param) in self._owner:
                continue
            owner = min(range(self._world_size), key=lambda r: (self._loads[r], r))
            self._owner[id(param)] = owner
            self._loads[owner] += param.numel()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for outer, inner in zip(self.param_groups, self.optimizer.param_groups):
            for key, value in outer.items():
                if key != "params":
                    inner[key] = value
        self.optimizer.step()
        for group in self.param_groups:
            for param in group["params"]:
                dist.broadcast(param.data, src=self._owner[id(param)])
        return loss
