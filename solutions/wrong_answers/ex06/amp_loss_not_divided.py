"""Backpropagates each micro-batch's whole loss: the gradient of the sum, len(micro_batches) times too big."""

LOSES = ["test_amp_train_step_matches_torchs_amp_recipe"]


def amp_train_step(model, optimizer, scaler, micro_batches, loss_fn, *, device_type="cpu", dtype=torch.bfloat16,
                   max_norm=None):
    micro_batches = list(micro_batches)
    if not micro_batches:
        raise ValueError("micro_batches is empty")
    total = 0.0
    for inputs, targets in micro_batches:
        with torch.autocast(device_type, dtype=dtype):
            loss = loss_fn(model(inputs), targets)
        scaler.scale(loss).backward()
        total += loss.item()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total / len(micro_batches)
