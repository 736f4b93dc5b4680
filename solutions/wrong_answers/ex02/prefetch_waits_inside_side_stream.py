"""Prefetcher calls current_stream().wait_stream(side) inside `with torch.cuda.stream(side)`: the side stream waits for itself."""

LOSES = ["test_prefetcher_on_a_simulated_gpu_is_race_free_and_memory_safe",
         "test_prefetcher_on_a_simulated_gpu_overlaps_copies_with_compute"]


class Prefetcher(Prefetcher):  # noqa: F811
    def __iter__(self):
        batches = iter(self.loader)
        if self.device.type != "cuda":
            ahead = _next_or_none(batches)
            while ahead is not None:
                batch, ahead = ahead[0], _next_or_none(batches)
                yield map_tensors(batch, lambda t: t.to(self.device))
            return
        side = torch.cuda.Stream(self.device)

        def start_copy():
            item = _next_or_none(batches)
            if item is None:
                return None
            pinned = map_tensors(item[0], lambda t: t if t.is_pinned() else t.pin_memory())
            with torch.cuda.stream(side):
                moved = map_tensors(pinned, lambda t: t.to(self.device, non_blocking=True))
                torch.cuda.current_stream(self.device).wait_stream(side)  # current is `side` here
                map_tensors(moved, lambda t: t.record_stream(torch.cuda.default_stream(self.device)))
                return (moved,)

        ahead = start_copy()
        while ahead is not None:
            batch = ahead[0]
            ahead = start_copy()
            yield batch
