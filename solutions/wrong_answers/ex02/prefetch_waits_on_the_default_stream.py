"""Prefetcher makes default_stream(device) wait and records it, where the caller's current stream is needed: a caller on its own stream reads batches mid-copy."""

LOSES = ["test_prefetcher_on_a_simulated_gpu_is_race_free_and_memory_safe"]


class Prefetcher(Prefetcher):  # noqa: F811
    def __iter__(self):
        batches = iter(self.loader)
        if self.device.type != "cuda":
            yield from super().__iter__()
            return
        side = torch.cuda.Stream(self.device)

        def start_copy():
            item = _next_or_none(batches)
            if item is None:
                return None
            pinned = map_tensors(item[0], lambda t: t if t.is_pinned() else t.pin_memory())
            with torch.cuda.stream(side):
                return (map_tensors(pinned, lambda t: t.to(self.device, non_blocking=True)),)

        ahead = start_copy()
        while ahead is not None:
            batch = ahead[0]
            caller = torch.cuda.default_stream(self.device)  # the stream the caller uses... unless it chose its own
            caller.wait_stream(side)
            map_tensors(batch, lambda t: t.record_stream(caller))
            ahead = start_copy()
            yield batch
