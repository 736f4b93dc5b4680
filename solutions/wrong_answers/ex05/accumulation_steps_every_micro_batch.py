"""Steps the optimizer after every micro-batch (and all-reduces each one): no accumulation at all."""

LOSES = ["test_train_with_accumulation_matches_one_big_batch", "test_train_with_accumulation_all_reduces_once_per_step"]


def train_with_accumulation(ddp_model, optimizer, loss_fn, micro_batches, accumulation_steps):
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise ValueError("accumulation_steps must be a whole number, 1 or more")
    losses = []
    for inputs, targets in micro_batches:
        optimizer.zero_grad()
        loss = loss_fn(ddp_model(inputs), targets)
        (loss / accumulation_steps).backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
