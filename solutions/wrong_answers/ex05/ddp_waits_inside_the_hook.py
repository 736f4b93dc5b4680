"""Waits for each bucket's all-reduce inside the hook: right values, but backward stalls on every bucket."""

LOSES = ["test_mini_ddp_overlaps_all_reduces_with_backward"]


class MiniDDP(MiniDDP):  # noqa: F811
    def _gradient_ready(self, bucket_index, offset, param):
        bucket = self._buckets[bucket_index]
        bucket.buffer[offset:offset + param.numel()].copy_(param.grad.reshape(-1))
        bucket.ready += 1
        while (self._next_to_start < len(self._buckets)
               and self._buckets[self._next_to_start].ready == len(self._buckets[self._next_to_start].params)):
            full = self._buckets[self._next_to_start]
            full.buffer.div_(self._world_size)
            full.work = dist.all_reduce(full.buffer, async_op=True)
            full.work.wait()  # "to be safe"
            self._next_to_start += 1
