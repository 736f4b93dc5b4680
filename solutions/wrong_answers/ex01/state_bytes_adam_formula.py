"""Predicts optimizer states as two copies of the parameters (Adam's rule) instead of measuring optimizer.state."""

LOSES = ["test_training_state_bytes_matches_the_tensors"]


def training_state_bytes(model, optimizer):
    if not isinstance(model, nn.Module):
        raise TypeError("model must be a torch.nn.Module")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("optimizer must be a torch.optim.Optimizer")
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    param_bytes = sum(t.numel() * t.element_size() for t in params)
    return {"parameters": param_bytes, "gradients": sum(t.numel() * t.element_size() for t in grads),
            "optimizer_states": 2 * param_bytes}
