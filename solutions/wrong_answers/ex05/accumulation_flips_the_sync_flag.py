"""Turns DDP's sync off by setting its private require_backward_grad_sync flag instead of using no_sync()."""

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
        for i, (inputs, targets) in enumerate(window):
            ddp_model.require_backward_grad_sync = i == len(window) - 1
            loss = loss_fn(ddp_model(inputs), targets)
            (loss / len(window)).backward()
            total += loss.item()
        ddp_model.require_backward_grad_sync = True
        optimizer.step()
        losses.append(total / len(window))
    return losses
