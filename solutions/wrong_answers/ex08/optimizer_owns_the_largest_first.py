"""Assigns each group's parameters greedily but largest first (sorted by size), not in the order they arrive."""

LOSES = ["test_sharded_optimizer_keeps_the_state_of_its_own_parameters_only"]


class ShardedOptimizer(ShardedOptimizer):  # noqa: F811
    def add_param_group(self, param_group):
        torch.optim.Optimizer.add_param_group(self, param_group)
        group = self.param_groups[-1]
        for param in sorted(group["params"], key=lambda p: -p.numel()):
            if id(param) in self._owner:
                continue
            owner = min(range(self._world_size), key=lambda r: (self._loads[r], r))
            self._owner[id(param)] = owner
            self._loads[owner] += param.numel()
        if self.optimizer is not None:
            self.optimizer.add_param_group(self._own_group(group))
