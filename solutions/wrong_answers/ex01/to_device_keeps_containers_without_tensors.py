"""Returns a container as it is when it holds no tensor (nothing to move), so the result shares the caller's lists."""

LOSES = ["test_to_device_moves_every_tensor_and_keeps_the_structure"]


def _holds_a_tensor(batch):
    if isinstance(batch, torch.Tensor):
        return True
    if isinstance(batch, Mapping):
        return any(_holds_a_tensor(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return any(_holds_a_tensor(v) for v in batch)
    return False


def to_device(batch, device):
    if not isinstance(device, (str, torch.device)):
        raise TypeError("device must be a str such as 'cuda:0' or a torch.device")
    if not _holds_a_tensor(batch):
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, defaultdict):
        return type(batch)(batch.default_factory, ((k, to_device(v, device)) for k, v in batch.items()))
    if isinstance(batch, Mapping):
        return type(batch)((key, to_device(value, device)) for key, value in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(value, device) for value in batch))
    return type(batch)(to_device(value, device) for value in batch)
