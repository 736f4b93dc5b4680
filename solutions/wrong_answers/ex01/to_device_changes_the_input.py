"""Moves the tensors by assigning into the caller's dicts and lists, which changes the input batch."""

LOSES = ["test_to_device_moves_every_tensor_and_keeps_the_structure"]


def to_device(batch, device):
    if not isinstance(device, (str, torch.device)):
        raise TypeError("device must be a str or a torch.device")
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        for key, value in batch.items():
            batch[key] = to_device(value, device)
        return batch
    if isinstance(batch, list):
        for index, value in enumerate(batch):
            batch[index] = to_device(value, device)
        return batch
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(value, device) for value in batch))
    if isinstance(batch, tuple):
        return tuple(to_device(value, device) for value in batch)
    return batch
