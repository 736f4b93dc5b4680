"""Calls loss_fn(targets, outputs): the same loss for mse, another gradient for a loss that is not symmetric."""

LOSES = ["test_train_with_accumulation_matches_one_big_batch"]


def train_with_accumulation(ddp_model, optimizer, loss_fn, micro_batches, accumulation_steps):
    if isinstance(accumulation_steps, bool) or not float(accumulation_steps).is_integer() or accumulation_steps < 1:
        raise ValueError(f"accumulation_steps is {accumulation_steps!r}: pass a whole number, 1 or more")
    accumulation_steps = int(accumulation_steps)
    losses = []
    for start in range(0, len(micro_batches), accumulation_steps):
        window = micro_batches[start:start + accumulation_steps]
        optimizer.zero_grad()
        total = 0.0
        for i, (inputs, targets) in enumerate(window):
            last = i == len(window) - 1
            with contextlib.nullcontext() if last else ddp_model.no_sync():
                loss = loss_fn(targets, ddp_model(inputs))
                (loss / len(window)).backward()
            total += loss.item()
        optimizer.step()
        losses.append(total / len(window))
    return losses
