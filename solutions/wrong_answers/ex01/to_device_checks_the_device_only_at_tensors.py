"""Checks the device's type only when it reaches a tensor, so a batch without tensors accepts device=3.5."""

LOSES = ["test_to_device_rejects_a_device_that_is_not_a_device"]


def to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        if not isinstance(device, (str, torch.device)):
            raise TypeError("device must be a str such as 'cuda:0' or a torch.device")
        return batch.to(device)
    if isinstance(batch, defaultdict):
        return type(batch)(batch.default_factory, ((k, to_device(v, device)) for k, v in batch.items()))
    if isinstance(batch, Mapping):
        return type(batch)((key, to_device(value, device)) for key, value in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(value, device) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch
