"""Checks the device by calling torch.device(device), which also accepts an int (0 means cuda:0), not only str or device."""

LOSES = ["test_to_device_rejects_a_device_that_is_not_a_device"]

_solution_to_device = to_device


def to_device(batch, device):
    device = torch.device(device)  # raises for what cannot be a device
    return _solution_to_device(batch, device)
