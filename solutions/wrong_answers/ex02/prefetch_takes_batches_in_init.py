"""Prefetcher takes the first batch from the loader in __init__: a second pass starts from a stale iterator."""

LOSES = ["test_prefetcher_yields_the_loader_batches_in_order", "test_prefetcher_stays_exactly_one_batch_ahead"]


class Prefetcher(Prefetcher):  # noqa: F811
    def __init__(self, loader, device):
        super().__init__(loader, device)
        self._batches = iter(loader)
        self._ahead = _next_or_none(self._batches)

    def __iter__(self):
        ahead = self._ahead
        while ahead is not None:
            batch, ahead = ahead[0], _next_or_none(self._batches)
            self._ahead = ahead
            yield map_tensors(batch, lambda t: t.to(self.device))
