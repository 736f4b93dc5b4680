"""Accumulates without ddp_model.no_sync(): right parameters, but DDP all-reduces after every micro-batch's backward."""

LOSES = ["test_train_with_accumulation_all_reduces_once_per_step"]


def train_with_accumulation(ddp_model, optimizer, loss_fn, micro_batches, accumulation_steps):
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise ValueError("accumulation_steps must be a whole number, 1 or more")
    micro_batches = list(micro_batches)
    losses = []
    for start in range(0, len(micro_batches), accumulation_steps):
        window = micro_batches[start:start + accumulation_steps]
        optimizer.zero_grad()
        total = 0.0
        for inputs, targets in window:
            loss = loss_fn(ddp_model(inputs), targets)
            (loss / len(window)).backward()
            total += loss.item()
        optimizer.step()
        losses.append(total / len(window))
    return losses
