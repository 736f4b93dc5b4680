"""map_tensors writes fn(t) back into the batch's own lists and dicts: right values, but the caller's batch is changed."""

LOSES = ["test_map_tensors_keeps_any_structure"]

from collections import UserDict


def map_tensors(batch, fn):
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, (dict, UserDict)) or isinstance(batch, list):
        for key in (batch.keys() if not isinstance(batch, list) else range(len(batch))):
            batch[key] = map_tensors(batch[key], fn)
        return batch
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(map_tensors(value, fn) for value in batch))
    if isinstance(batch, tuple):
        return tuple(map_tensors(value, fn) for value in batch)
    return batch

