"""Takes the parameters and gradients from optimizer.param_groups: misses the model's other parameters, adds outside ones."""

LOSES = ["test_training_state_bytes_matches_the_tensors"]


def training_state_bytes(model, optimizer):
    if not isinstance(model, nn.Module):
        raise TypeError("model must be a torch.nn.Module")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("optimizer must be a torch.optim.Optimizer")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grads = [p.grad for p in params if p.grad is not None]
    states = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return {"parameters": sum(t.numel() * t.element_size() for t in params),
            "gradients": sum(t.numel() * t.element_size() for t in grads),
            "optimizer_states": sum(t.numel() * t.element_size() for t in states)}
