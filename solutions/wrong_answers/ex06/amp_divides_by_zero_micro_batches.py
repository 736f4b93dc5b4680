"""Does not check for an empty list: no backward, then the scaler (or a division by zero) fails instead."""

LOSES = ["test_amp_train_step_rejects_no_micro_batches"]


def amp_train_step(model, optimizer, scaler, micro_batches, loss_fn, *, device_type="cpu", dtype=torch.bfloat16,
                   max_norm=None):
    total = 0.0
    for inputs, targets in micro_batches:
        with torch.autocast(device_type, dtype=dtype):
            loss = loss_fn(model(inputs), targets)
        scaler.scale(loss / len(micro_batches)).backward()
        total += loss.item()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total / len(micro_batches)
