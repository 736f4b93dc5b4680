"""gather rebuilds every mapping as a plain dict: a model's OrderedDict or defaultdict of outputs comes back a dict."""

LOSES = ["test_gather_concatenates_generated_outputs"]


def gather(outputs, device, dim=0):
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        parts = [out.to(device) for out in outputs]
        if all(part.dim() == 0 for part in parts):
            parts = [part.reshape(1) for part in parts]
        return torch.cat(parts, dim)
    if first is None:
        return None
    if isinstance(first, Mapping):
        return {key: gather([out[key] for out in outputs], device, dim) for key in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(gather(list(parts), device, dim) for parts in zip(*outputs)))
    if isinstance(first, (list, tuple)):
        return type(first)(gather(list(parts), device, dim) for parts in zip(*outputs))
    raise TypeError(f"cannot gather outputs of type {type(first).__name__}: return tensors, or containers of them")
