"""gather stacks the outputs (a new replica dimension) instead of concatenating them along dim."""

LOSES = ["test_gather_concatenates_in_order_and_keeps_gradients", "test_gather_handles_nested_outputs_and_scalar_losses"]


def gather(outputs, device, dim=0):
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        parts = [o.to(device) for o in outputs]
        if all(p.shape == parts[0].shape for p in parts):
            return torch.stack(parts, dim)
        return torch.cat(parts, dim)  # stack fails on uneven chunks, so fall back there
    if first is None:
        return None
    if isinstance(first, Mapping):
        return type(first)((k, gather([o[k] for o in outputs], device, dim)) for k in first)
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(gather(list(p), device, dim) for p in zip(*outputs)))
    if isinstance(first, (list, tuple)):
        return type(first)(gather(list(p), device, dim) for p in zip(*outputs))
    raise TypeError(f"cannot gather {type(first).__name__}")
