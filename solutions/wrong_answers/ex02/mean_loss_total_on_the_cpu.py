"""mean_loss adds each device loss into a CPU tensor in place (total += loss): fine on the CPU, an error on a GPU."""

LOSES = ["test_mean_loss_on_a_simulated_gpu_reads_once_on_any_device"]


def mean_loss(model, batches):
    if len(batches) == 0:
        raise ValueError("no batches")
    with torch.no_grad():
        total = torch.zeros(())
        for x, y in batches:
            total += torch.nn.functional.cross_entropy(model(x), y)
        return (total / len(batches)).item()
