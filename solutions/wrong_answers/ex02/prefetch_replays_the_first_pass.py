"""Prefetcher keeps the batches of its first pass on the device and hands them out again on later passes: no copies, but a shuffled loader's new batches are never seen."""

LOSES = ["test_prefetcher_yields_the_loader_batches_in_order", "test_prefetcher_moves_any_batches_to_any_device"]


class Prefetcher(Prefetcher):  # noqa: F811
    def __iter__(self):
        cached = getattr(self, "_cache", None)
        if cached is not None:
            for batch in cached:
                if self.device.type == "cuda":
                    map_tensors(batch, lambda t: t.record_stream(torch.cuda.current_stream(self.device)))
                yield batch
            return
        seen = []
        for batch in super().__iter__():
            seen.append(batch)
            yield batch
        self._cache = seen
