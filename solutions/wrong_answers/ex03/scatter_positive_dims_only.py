"""scatter takes dim as an index from the front only, and rejects negative dims (dim=-1 is the last dimension)."""

LOSES = ["test_scatter_splits_generated_batches_like_torch_chunk"]


def scatter(inputs, devices, dim=0):
    if len(devices) == 0:
        raise ValueError("scatter needs at least one device")
    sizes = set()

    def sizes_of(obj):
        if isinstance(obj, torch.Tensor):
            if not 0 <= dim < obj.dim() or obj.size(dim) == 0:
                raise ValueError(f"cannot scatter a tensor of shape {tuple(obj.shape)} along dim {dim}")
            sizes.add(obj.size(dim))
        elif isinstance(obj, Mapping):
            for value in obj.values():
                sizes_of(value)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                sizes_of(value)

    sizes_of(inputs)
    if len(sizes) > 1:
        raise ValueError(f"every tensor must have the same size along dim {dim}, got sizes {sorted(sizes)}")
    if not sizes:
        return [inputs for _ in devices]
    replicas = len(torch.empty(sizes.pop(), device="meta").chunk(len(devices)))

    def piece(obj, i):
        if isinstance(obj, torch.Tensor):
            return obj.chunk(len(devices), dim)[i].to(devices[i])
        if isinstance(obj, Mapping):
            return _same_mapping(obj, ((key, piece(value, i)) for key, value in obj.items()))
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(piece(value, i) for value in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(piece(value, i) for value in obj)
        return obj

    return [piece(inputs, i) for i in range(replicas)]
