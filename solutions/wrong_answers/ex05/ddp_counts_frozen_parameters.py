"""Buckets frozen parameters too: a bucket holding one waits for a gradient that never comes."""

LOSES = ["test_mini_ddp_matches_a_single_process_on_the_whole_batch"]


class MiniDDP(MiniDDP):  # noqa: F811
    def __init__(self, module, bucket_cap_mb=25.0):
        nn.Module.__init__(self)
        self.module = module
        with torch.no_grad():
            for tensor in itertools.chain(module.parameters(), module.buffers()):
                dist.broadcast(tensor.detach(), src=0)
        params = list(module.parameters())
        sizes = [p.numel() * p.element_size() for p in params]
        assignment = bucket_assignment(sizes, bucket_cap_mb, min(1.0, bucket_cap_mb))
        self._buckets = [_Bucket([params[i] for i in indices]) for indices in assignment]
        self._next_to_start = 0
        self._world_size = dist.get_world_size()
        for b, bucket in enumerate(self._buckets):
            for param, offset in zip(bucket.params, bucket.offsets):
                if param.requires_grad:  # a frozen parameter cannot take a hook
                    param.register_post_accumulate_grad_hook(
                        lambda p, b=b, offset=offset: self._gradient_ready(b, offset, p))
