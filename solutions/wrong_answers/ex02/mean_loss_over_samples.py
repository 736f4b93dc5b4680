"""mean_loss weights each batch's loss by its size (a mean over samples), where the mean over batches was asked for."""

LOSES = ["test_mean_loss_matches_the_slow_version_without_gradients"]


def mean_loss(model, batches):
    if not batches:
        raise ValueError("no batches")
    with torch.no_grad():
        total = sum(torch.nn.functional.cross_entropy(model(x), y, reduction="sum") for x, y in batches)
        return (total / sum(len(y) for _, y in batches)).item()
