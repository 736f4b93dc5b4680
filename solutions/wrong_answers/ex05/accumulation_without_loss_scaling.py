"""Never divides the micro-batch losses by the window's length: steps accumulation_steps times too big."""

LOSES = ["test_train_with_accumulation_matches_one_big_batch"]


def train_with_accumulation(ddp_model, optimizer, loss_fn, micro_batches, accumulation_steps):
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise ValueError("accumulation_steps must be a whole number, 1 or more")
    micro_batches = list(micro_batches)
    losses = []
    for start in range(0, len(micro_batches), accumulation_steps):
        window = micro_batches[start:start + accumulation_steps]
        optimizer.zero_grad()
        total = 0.0
        for i, (inputs, targets) in enumerate(window):
            with contextlib.nullcontext() if i == len(window) - 1 else ddp_model.no_sync():
                loss = loss_fn(ddp_model(inputs), targets)
                loss.backward()
            total += loss.item()
        optimizer.step()
        losses.append(total / len(window))
    return losses
