"""gather concatenates the replicas' tensors where they are, then moves the result: torch.cat refuses tensors on two devices."""

LOSES = ["test_gather_moves_each_part_to_the_target_device_first"]


def gather(outputs, device, dim=0):
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        parts = [out.reshape(1) if out.dim() == 0 else out for out in outputs]
        return torch.cat(parts, dim).to(device)  # one copy instead of one per replica
    if first is None:
        return None
    if isinstance(first, Mapping):
        return _same_mapping(first, ((key, gather([out[key] for out in outputs], device, dim)) for key in first))
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(gather(list(parts), device, dim) for parts in zip(*outputs)))
    if isinstance(first, (list, tuple)):
        return type(first)(gather(list(parts), device, dim) for parts in zip(*outputs))
    raise TypeError(f"cannot gather outputs of type {type(first).__name__}: return tensors, or containers of them")
