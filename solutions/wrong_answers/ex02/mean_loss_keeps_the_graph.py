"""mean_loss adds the losses up with autograd recording: one read, but every batch's graph stays alive until the end."""

LOSES = ["test_mean_loss_matches_the_slow_version_without_gradients"]


def mean_loss(model, batches):
    if not batches:
        raise ValueError("no batches")
    total = 0
    for x, y in batches:
        total = total + torch.nn.functional.cross_entropy(model(x), y)
    return (total / len(batches)).item()
