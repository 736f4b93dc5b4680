"""Counts .grad only for parameters that require grad: a layer frozen after backward still holds its gradients."""

LOSES = ["test_training_state_bytes_matches_the_tensors"]


def training_state_bytes(model, optimizer):
    if not isinstance(model, nn.Module):
        raise TypeError("model must be a torch.nn.Module")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("optimizer must be a torch.optim.Optimizer")
    params = list(model.parameters())
    grads = [p.grad for p in params if p.requires_grad and p.grad is not None]
    states = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return {"parameters": sum(t.numel() * t.element_size() for t in params),
            "gradients": sum(t.numel() * t.element_size() for t in grads),
            "optimizer_states": sum(t.numel() * t.element_size() for t in states)}
