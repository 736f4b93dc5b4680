"""Builds each mapping empty, type(batch)(), and fills it: a defaultdict comes back without its default_factory."""

LOSES = ["test_to_device_moves_every_tensor_and_keeps_the_structure"]


def to_device(batch, device):
    if not isinstance(device, (str, torch.device)):
        raise TypeError("device must be a str such as 'cuda:0' or a torch.device")
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        moved = type(batch)()
        for key, value in batch.items():
            moved[key] = to_device(value, device)
        return moved
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(value, device) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch
