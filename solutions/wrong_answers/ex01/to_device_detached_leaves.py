"""Moves t.detach() and sets requires_grad again: the flag is right, but gradients never reach the original tensor."""

LOSES = ["test_to_device_keeps_requires_grad_and_the_graph"]


def to_device(batch, device):
    if not isinstance(device, (str, torch.device)):
        raise TypeError("device must be a str such as 'cuda:0' or a torch.device")
    if isinstance(batch, torch.Tensor):
        return batch.detach().to(device).requires_grad_(batch.requires_grad)
    if isinstance(batch, defaultdict):
        return type(batch)(batch.default_factory, ((k, to_device(v, device)) for k, v in batch.items()))
    if isinstance(batch, Mapping):
        return type(batch)((key, to_device(value, device)) for key, value in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(value, device) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch
