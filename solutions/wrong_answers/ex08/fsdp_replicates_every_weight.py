"""Keeps the whole weight as each rank's "shard": nothing is saved, every rank steps the full weight."""

LOSES = ["test_mini_fsdp_keeps_only_its_shard"]


class MiniFSDP(MiniFSDP):  # noqa: F811
    def __init__(self, module, compute_dtype=None):
        nn.Module.__init__(self)
        self.module = module
        self.compute_dtype = compute_dtype
        self._world_size = dist.get_world_size()
        for layer in module.modules():
            for param in layer.parameters(recurse=False):
                param.register_hook(lambda g: g / self._world_size)

    def finish_gradient_synchronization(self):
        for param in self.module.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad)

    def gather_full_params(self):
        return {name: p.detach().clone() for name, p in self.module.named_parameters()}
