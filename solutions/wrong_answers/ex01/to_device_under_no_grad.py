"""Moves every tensor under torch.no_grad() (moving data needs no gradients), so the copies lose requires_grad."""

LOSES = ["test_to_device_keeps_requires_grad_and_the_graph"]

_solution_to_device = to_device


def to_device(batch, device):
    with torch.no_grad():
        return _solution_to_device(batch, device)
