"""Takes only Python ints as accumulation_steps: 4.0 is refused, though a count may be an integral float."""

LOSES = ["test_train_with_accumulation_matches_one_big_batch"]

_train_with_accumulation = train_with_accumulation


def train_with_accumulation(ddp_model, optimizer, loss_fn, micro_batches, accumulation_steps):
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise ValueError(f"accumulation_steps is {accumulation_steps!r}: pass a whole number of micro-batches per "
                         "optimizer step, 1 or more")
    return _train_with_accumulation(ddp_model, optimizer, loss_fn, micro_batches, accumulation_steps)
