"""Gives torch's Optimizer only the rank's own parameters: param_groups and zero_grad miss the others."""

LOSES = ["test_sharded_optimizer_param_groups_hold_every_parameter"]


class ShardedOptimizer(ShardedOptimizer):  # noqa: F811
    def __init__(self, params, optimizer_cls, **defaults):
        rank, world_size = dist.get_rank(), dist.get_world_size()
        groups = list(params)
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        loads, self._all = [0] * world_size, []
        owner, own_groups = {}, []
        for group in groups:
            mine = []
            for param in group["params"]:
                self._all.append(param)
                r = min(range(world_size), key=lambda i: (loads[i], i))
                owner[id(param)] = r
                loads[r] += param.numel()
                if r == rank:
                    mine.append(param)
            own_groups.append({**group, "params": mine})
        self._owner, self._rank = owner, rank
        torch.optim.Optimizer.__init__(self, own_groups, defaults)
        self.optimizer = optimizer_cls(own_groups, **defaults)

    def add_param_group(self, param_group):
        torch.optim.Optimizer.add_param_group(self, param_group)

    @torch.no_grad()
    def step(self, closure=None):
        for outer, inner in zip(self.param_groups, self.optimizer.param_groups):
            for key, value in outer.items():
                if key != "params":
                    inner[key] = value
        self.optimizer.step()
        for param in self._all:
            dist.broadcast(param.data, src=self._owner[id(param)])
