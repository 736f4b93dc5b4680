"""Leaves out the type checks, so a string passed as the optimizer fails with AttributeError, not TypeError."""

LOSES = ["test_training_state_bytes_rejects_wrong_types"]


def training_state_bytes(model, optimizer):
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    states = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return {"parameters": sum(t.numel() * t.element_size() for t in params),
            "gradients": sum(t.numel() * t.element_size() for t in grads),
            "optimizer_states": sum(t.numel() * t.element_size() for t in states)}
