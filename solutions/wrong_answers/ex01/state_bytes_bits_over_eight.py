"""Takes bytes per number as torch.finfo(dtype).bits / 8: the right sizes, but floats where ints are promised."""

LOSES = ["test_training_state_bytes_matches_the_tensors"]


def _bytes(tensors):
    return sum(t.numel() * torch.finfo(t.dtype).bits / 8 for t in tensors)


def training_state_bytes(model, optimizer):
    if not isinstance(model, nn.Module):
        raise TypeError("model must be a torch.nn.Module")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("optimizer must be a torch.optim.Optimizer")
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    states = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return {"parameters": _bytes(params), "gradients": _bytes(grads), "optimizer_states": _bytes(states)}
