"""Drops the micro-batches after the last full window: their data is never trained on."""

LOSES = ["test_train_with_accumulation_matches_one_big_batch", "test_train_with_accumulation_all_reduces_once_per_step"]

_train_with_accumulation = train_with_accumulation


def train_with_accumulation(ddp_model, optimizer, loss_fn, micro_batches, accumulation_steps):
    if isinstance(accumulation_steps, int) and accumulation_steps >= 1:
        micro_batches = list(micro_batches)[:len(micro_batches) // accumulation_steps * accumulation_steps]
    return _train_with_accumulation(ddp_model, optimizer, loss_fn, micro_batches, accumulation_steps)
