"""map_tensors rebuilds every mapping as a plain dict: an OrderedDict, a defaultdict or a UserDict comes back as a dict."""

LOSES = ["test_map_tensors_keeps_any_structure", "test_prefetcher_yields_the_loader_batches_in_order"]


def map_tensors(batch, fn):
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {key: map_tensors(value, fn) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(map_tensors(value, fn) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(value, fn) for value in batch)
    return batch
