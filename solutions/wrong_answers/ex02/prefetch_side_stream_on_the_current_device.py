"""Prefetcher creates its side stream with torch.cuda.Stream() on the current device: copies to cuda:1 then run on cuda:1's current stream, the caller's, and overlap nothing."""

LOSES = ["test_prefetcher_on_a_simulated_gpu_overlaps_copies_with_compute"]


class Prefetcher(Prefetcher):  # noqa: F811
    def __iter__(self):
        batches = iter(self.loader)
        if self.device.type != "cuda":
            yield from super().__iter__()
            return
        side = torch.cuda.Stream()  # on the current device, which need not be self.device

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
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(side)
            map_tensors(batch, lambda t: t.record_stream(current))
            ahead = start_copy()
            yield batch
