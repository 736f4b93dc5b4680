"""Rebuilds tuples with type(batch)(generator), which a namedtuple refuses (it wants its fields as arguments)."""

LOSES = ["test_to_device_moves_every_tensor_and_keeps_the_structure"]


def to_device(batch, device):
    if not isinstance(device, (str, torch.device)):
        raise TypeError("device must be a str or a torch.device")
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, defaultdict):
        return type(batch)(batch.default_factory, ((k, to_device(v, device)) for k, v in batch.items()))
    if isinstance(batch, Mapping):
        return type(batch)((key, to_device(value, device)) for key, value in batch.items())
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch
