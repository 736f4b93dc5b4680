"""Prefetcher copies each batch only when asked for it (no prefetch): nothing is in flight while the caller waits on its results."""

LOSES = ["test_prefetcher_stays_exactly_one_batch_ahead",
         "test_prefetcher_on_a_simulated_gpu_overlaps_copies_with_compute"]


class Prefetcher(Prefetcher):  # noqa: F811
    def __iter__(self):
        if self.device.type != "cuda":
            for batch in self.loader:
                yield map_tensors(batch, lambda t: t.to(self.device))
            return
        side = torch.cuda.Stream(self.device)
        for batch in self.loader:
            pinned = map_tensors(batch, lambda t: t if t.is_pinned() else t.pin_memory())
            with torch.cuda.stream(side):
                moved = map_tensors(pinned, lambda t: t.to(self.device, non_blocking=True))
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(side)
            map_tensors(moved, lambda t: t.record_stream(current))
            yield moved
