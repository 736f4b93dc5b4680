"""mean_loss reads float(total.to("cpu", non_blocking=True)): the copy returns at once, before its value has arrived from the device."""

LOSES = ["test_mean_loss_on_a_simulated_gpu_reads_once_on_any_device"]


def mean_loss(model, batches):
    if len(batches) == 0:
        raise ValueError("no batches")
    with torch.no_grad():
        total = sum(torch.nn.functional.cross_entropy(model(x), y) for x, y in batches)
        return float((total / len(batches)).to("cpu", non_blocking=True))
