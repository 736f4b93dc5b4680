"""Moves only floating-point tensors (what the model computes with): masks and ids stay behind on the old device."""

LOSES = ["test_to_device_moves_every_tensor_and_keeps_the_structure"]


def to_device(batch, device):
    if not isinstance(device, (str, torch.device)):
        raise TypeError("device must be a str such as 'cuda:0' or a torch.device")
    if isinstance(batch, torch.Tensor):
        return batch.to(device) if batch.is_floating_point() else batch
    if isinstance(batch, defaultdict):
        return type(batch)(batch.default_factory, ((k, to_device(v, device)) for k, v in batch.items()))
    if isinstance(batch, Mapping):
        return type(batch)((key, to_device(value, device)) for key, value in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(value, device) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch
