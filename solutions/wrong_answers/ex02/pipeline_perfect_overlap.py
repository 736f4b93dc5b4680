"""pipeline_time says overlapped = max(n * copy, n * compute): as if copy and compute of the same batch could overlap."""

LOSES = ["test_pipeline_time_matches_the_schedule"]


def pipeline_time(n_batches, copy, compute, *, overlapped):
    if n_batches < 0 or copy < 0 or compute < 0:
        raise ValueError("negative")
    if not overlapped:
        return n_batches * (copy + compute)
    return max(n_batches * copy, n_batches * compute)
