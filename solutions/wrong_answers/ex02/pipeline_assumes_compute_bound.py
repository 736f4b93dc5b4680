"""pipeline_time says overlapped = copy + n * compute: right only when compute is the slower engine."""

LOSES = ["test_pipeline_time_matches_the_schedule", "test_pipeline_time_is_a_formula"]


def pipeline_time(n_batches, copy, compute, *, overlapped):
    if n_batches < 0 or copy < 0 or compute < 0:
        raise ValueError("negative")
    if n_batches == 0:
        return 0.0
    if not overlapped:
        return n_batches * (copy + compute)
    return copy + n_batches * compute
