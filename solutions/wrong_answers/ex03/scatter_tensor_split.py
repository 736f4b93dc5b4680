"""scatter splits with torch.tensor_split (sizes differ by at most one, always one chunk per device), not DataParallel's torch.chunk."""

LOSES = ["test_scatter_splits_like_data_parallel", "test_scatter_keeps_the_structure_and_shares_non_tensors"]


def scatter(inputs, devices, dim=0):
    if len(devices) == 0:
        raise ValueError("scatter needs at least one device")

    def piece(obj, i):
        if isinstance(obj, torch.Tensor):
            if obj.dim() == 0 or obj.size(dim) == 0:
                raise ValueError("cannot scatter an empty batch")
            return obj.tensor_split(len(devices), dim)[i].to(devices[i])
        if isinstance(obj, Mapping):
            return type(obj)((k, piece(v, i)) for k, v in obj.items())
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(piece(v, i) for v in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(piece(v, i) for v in obj)
        return obj

    sizes = {t.size(dim) for t in _tensors(inputs) if t.dim() > 0}
    if len(sizes) > 1:
        raise ValueError(f"tensors have different sizes along dim {dim}: {sorted(sizes)}")
    return [piece(inputs, i) for i in range(len(devices))]


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)
