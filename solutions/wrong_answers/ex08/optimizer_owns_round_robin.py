"""Assigns the parameters to the ranks round-robin by count (0, 1, 2, 0, ...), not greedily by size."""

LOSES = ["test_sharded_optimizer_keeps_the_state_of_its_own_parameters_only"]


class ShardedOptimizer(ShardedOptimizer):  # noqa: F811
    def add_param_group(self, param_group):
        torch.optim.Optimizer.add_param_group(self, param_group)
        group = self.param_groups[-1]
        for param in group["params"]:
            if id(param) not in self._owner:
                self._owner[id(param)] = len(self._owner) % self._world_size
        if self.optimizer is not None:
            self.optimizer.add_param_group(self._own_group(group))
