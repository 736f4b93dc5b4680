"""Wrapping the same module again leaves the first MiniDDP's hooks in place: two all-reduces per bucket per step."""

LOSES = ["test_mini_ddp_rewrapped_or_closed_hooks_once"]


class MiniDDP(MiniDDP):  # noqa: F811
    def __init__(self, module, bucket_cap_mb=25.0):
        nn.Module.__init__(self)
        self.module = module  # no look for a previous wrapper: its hooks keep firing
        with torch.no_grad():
            for tensor in itertools.chain(module.parameters(), module.buffers()):
                dist.broadcast(tensor.detach(), src=0)
        trainable = [p for p in module.parameters() if p.requires_grad]
        sizes = [p.numel() * p.element_size() for p in trainable]
        assignment = bucket_assignment(sizes, bucket_cap_mb, min(1.0, bucket_cap_mb))
        self._buckets = [_Bucket([trainable[i] for i in indices]) for indices in assignment]
        self._next_to_start = 0
        self._world_size = dist.get_world_size()
        self._handles = []
        for b, bucket in enumerate(self._buckets):
            for param, offset in zip(bucket.params, bucket.offsets):
                self._handles.append(param.register_post_accumulate_grad_hook(
                    lambda p, b=b, offset=offset: self._gradient_ready(b, offset, p)))
