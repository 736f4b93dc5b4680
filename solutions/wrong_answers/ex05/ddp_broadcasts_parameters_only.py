"""Broadcasts rank 0's parameters but not its buffers: each rank keeps its own buffer (here one used in forward)."""

LOSES = ["test_mini_ddp_broadcasts_parameters_and_buffers_from_rank_0",
         "test_mini_ddp_matches_a_single_process_on_the_whole_batch"]


class MiniDDP(MiniDDP):  # noqa: F811
    def __init__(self, module, bucket_cap_mb=25.0):
        nn.Module.__init__(self)
        self.module = module
        with torch.no_grad():
            for param in module.parameters():
                dist.broadcast(param.detach(), src=0)
        trainable = [p for p in module.parameters() if p.requires_grad]
        sizes = [p.numel() * p.element_size() for p in trainable]
        assignment = bucket_assignment(sizes, bucket_cap_mb, min(1.0, bucket_cap_mb))
        self._buckets = [_Bucket([trainable[i] for i in indices]) for indices in assignment]
        self._next_to_start = 0
        self._world_size = dist.get_world_size()
        for b, bucket in enumerate(self._buckets):
            for param, offset in zip(bucket.params, bucket.offsets):
                param.register_post_accumulate_grad_hook(
                    lambda p, b=b, offset=offset: self._gradient_ready(b, offset, p))
