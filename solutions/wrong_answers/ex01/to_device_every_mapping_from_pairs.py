"""Rebuilds every mapping with type(batch)(pairs), as the first reference did: a defaultdict wants its factory first."""

LOSES = ["test_to_device_moves_every_tensor_and_keeps_the_structure"]


def to_device(batch, device):
    if not isinstance(device, (str, torch.device)):
        raise TypeError("device must be a str such as 'cuda:0' or a torch.device")
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return type(batch)((key, to_device(value, device)) for key, value in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(value, device) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch
