"""pipeline_time returns the formula's value as it comes: an int when the times are ints, where a float is promised."""

LOSES = ["test_pipeline_time_matches_the_schedule", "test_pipeline_time_matches_the_schedule_for_any_sizes"]


def pipeline_time(n_batches, copy, compute, *, overlapped):
    if n_batches < 0 or copy < 0 or compute < 0:
        raise ValueError("negative")
    if n_batches == 0:
        return 0.0
    if not overlapped:
        return n_batches * (copy + compute)
    return copy + compute + (n_batches - 1) * max(copy, compute)
