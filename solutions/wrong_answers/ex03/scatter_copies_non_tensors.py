"""scatter gives every replica its own deep copy of the non-tensor values instead of the very same objects."""

LOSES = ["test_scatter_keeps_the_structure_and_shares_non_tensors"]

_reference_scatter = scatter


def scatter(inputs, devices, dim=0):
    return [_copy_leaves(replica) for replica in _reference_scatter(inputs, devices, dim)]


def _copy_leaves(obj):
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, Mapping):
        return type(obj)((k, _copy_leaves(v)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_copy_leaves(v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_copy_leaves(v) for v in obj)
    return copy.deepcopy(obj)  # "to be safe": a fresh copy per replica
