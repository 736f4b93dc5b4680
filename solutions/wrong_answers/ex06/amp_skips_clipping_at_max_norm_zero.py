"""Tests `if max_norm:` instead of `is not None`: max_norm=0.0 (clip every gradient to 0) does not clip at all."""

LOSES = ["test_amp_train_step_matches_torchs_amp_recipe", "test_amp_train_step_calls_the_scaler_in_order"]


def amp_train_step(model, optimizer, scaler, micro_batches, loss_fn, *, device_type="cpu", dtype=torch.bfloat16,
                   max_norm=None):
    micro_batches = list(micro_batches)
    if not micro_batches:
        raise ValueError("micro_batches is empty: pass a list of (inputs, targets) pairs, one or more")
    total = 0.0
    for inputs, targets in micro_batches:
        with torch.autocast(device_type, dtype=dtype):
            loss = loss_fn(model(inputs), targets)
        scaler.scale(loss / len(micro_batches)).backward()
        total += loss.item()
    if max_norm:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total / len(micro_batches)
