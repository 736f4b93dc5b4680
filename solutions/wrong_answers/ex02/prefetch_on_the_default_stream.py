"""Prefetcher copies one batch ahead but on the caller's own stream: copies and compute queue up one after the other."""

LOSES = ["test_prefetcher_on_a_simulated_gpu_overlaps_copies_with_compute"]


class Prefetcher(Prefetcher):  # noqa: F811
    def __iter__(self):
        batches = iter(self.loader)

        def start_copy():
            item = _next_or_none(batches)
            if item is None:
                return None
            if self.device.type == "cuda":
                pinned = map_tensors(item[0], lambda t: t if t.is_pinned() else t.pin_memory())
                return (map_tensors(pinned, lambda t: t.to(self.device, non_blocking=True)),)
            return (map_tensors(item[0], lambda t: t.to(self.device)),)

        ahead = start_copy()
        while ahead is not None:
            batch = ahead[0]
            ahead = start_copy()
            yield batch
