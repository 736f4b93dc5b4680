"""Counts the model's state_dict() as its parameters, which includes buffers such as BatchNorm's running statistics."""

LOSES = ["test_training_state_bytes_matches_the_tensors"]


def training_state_bytes(model, optimizer):
    if not isinstance(model, nn.Module):
        raise TypeError("model must be a torch.nn.Module")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("optimizer must be a torch.optim.Optimizer")
    unique = {t.data_ptr(): t for t in model.state_dict().values()}.values()  # tied weights once
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    states = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return {"parameters": sum(t.numel() * t.element_size() for t in unique),
            "gradients": sum(t.numel() * t.element_size() for t in grads),
            "optimizer_states": sum(t.numel() * t.element_size() for t in states)}
