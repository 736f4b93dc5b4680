"""Broadcasts the tensors of module.state_dict(), which leaves out non-persistent buffers: each rank keeps its own."""

LOSES = ["test_mini_ddp_on_generated_models_in_bucket_order"]


class MiniDDP(MiniDDP):  # noqa: F811
    def __init__(self, module, bucket_cap_mb=25.0):
        nn.Module.__init__(self)
        self.module = module
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, numbers.Real) or not bucket_cap_mb >= 0:
            raise ValueError(f"bucket_cap_mb is {bucket_cap_mb!r}: pass a bucket size in MiB, 0 or more")
        previous = getattr(module, "_mini_ddp", None)
        previous = previous() if isinstance(previous, weakref.ref) else None
        if previous is not None and previous.module is module:
            previous.close()
        with torch.no_grad():
            for tensor in module.state_dict().values():  # parameters and persistent buffers only
                dist.broadcast(tensor, src=0)
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
        module._mini_ddp = weakref.ref(self)
