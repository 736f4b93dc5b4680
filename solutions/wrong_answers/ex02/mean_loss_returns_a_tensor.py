"""mean_loss returns the total as a device tensor, never reading it: no wait, but not the Python float asked for."""

LOSES = ["test_mean_loss_reads_the_device_once"]


def mean_loss(model, batches):
    if not batches:
        raise ValueError("no batches")
    with torch.no_grad():
        total = sum(torch.nn.functional.cross_entropy(model(x), y) for x, y in batches)
        return total / len(batches)
