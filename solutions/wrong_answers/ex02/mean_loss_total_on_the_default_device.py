"""mean_loss starts its total on "cuda" (the current device) when CUDA is available: with the model on cuda:1, the sum mixes two devices."""

LOSES = ["test_mean_loss_on_a_simulated_gpu_reads_once_on_any_device"]


def mean_loss(model, batches):
    if len(batches) == 0:
        raise ValueError("no batches")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.no_grad():
        total = torch.zeros((), device=device)
        for x, y in batches:
            total = total + torch.nn.functional.cross_entropy(model(x), y)
        return (total / len(batches)).item()
