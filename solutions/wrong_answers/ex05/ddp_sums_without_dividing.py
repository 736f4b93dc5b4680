"""All-reduces the buckets without dividing by the world size: every rank steps with the SUM of the gradients."""

LOSES = ["test_mini_ddp_matches_a_single_process_on_the_whole_batch"]


class MiniDDP(MiniDDP):  # noqa: F811
    def _gradient_ready(self, bucket_index, offset, param):
        bucket = self._buckets[bucket_index]
        bucket.buffer[offset:offset + param.numel()].copy_(param.grad.reshape(-1))
        bucket.ready += 1
        while (self._next_to_start < len(self._buckets)
               and self._buckets[self._next_to_start].ready == len(self._buckets[self._next_to_start].params)):
            full = self._buckets[self._next_to_start]
            full.work = dist.all_reduce(full.buffer, async_op=True)
            self._next_to_start += 1
