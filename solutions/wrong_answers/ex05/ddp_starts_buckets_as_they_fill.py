"""Starts each bucket's all-reduce as soon as it is full, whatever the order: wrong for out-of-order forwards."""

LOSES = ["test_mini_ddp_on_generated_models_in_bucket_order"]


class MiniDDP(MiniDDP):  # noqa: F811
    def _gradient_ready(self, bucket_index, offset, param):
        bucket = self._buckets[bucket_index]
        torch.div(param.grad.reshape(-1), self._world_size, out=bucket.buffer.narrow(0, offset, param.numel()))
        bucket.ready += 1
        if bucket.ready == len(bucket.params):  # full: start it now, before the buckets ahead of it
            bucket.work = dist.all_reduce(bucket.buffer, async_op=True)
