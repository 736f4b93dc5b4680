"""Counts one gradient per parameter, as if every parameter had one (frozen ones and zero_grad() say otherwise)."""

LOSES = ["test_training_state_bytes_matches_the_tensors"]


def training_state_bytes(model, optimizer):
    if not isinstance(model, nn.Module):
        raise TypeError("model must be a torch.nn.Module")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("optimizer must be a torch.optim.Optimizer")
    params = list(model.parameters())
    states = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    param_bytes = sum(t.numel() * t.element_size() for t in params)
    return {"parameters": param_bytes, "gradients": param_bytes,
            "optimizer_states": sum(t.numel() * t.element_size() for t in states)}
