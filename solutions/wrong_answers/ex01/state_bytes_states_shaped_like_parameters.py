"""Counts only the states shaped like their parameter, so Adam's small step tensors are left out."""

LOSES = ["test_training_state_bytes_matches_the_tensors"]


def training_state_bytes(model, optimizer):
    if not isinstance(model, nn.Module):
        raise TypeError("model must be a torch.nn.Module")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("optimizer must be a torch.optim.Optimizer")
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    states = [v for p, state in optimizer.state.items() for v in state.values()
              if isinstance(v, torch.Tensor) and v.shape == p.shape]
    return {"parameters": sum(t.numel() * t.element_size() for t in params),
            "gradients": sum(t.numel() * t.element_size() for t in grads),
            "optimizer_states": sum(t.numel() * t.element_size() for t in states)}
