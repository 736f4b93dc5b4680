"""pipeline_time says overlapped = n * max(copy, compute): it forgets that the first copy and the last compute overlap nothing."""

LOSES = ["test_pipeline_time_matches_the_schedule"]


def pipeline_time(n_batches, copy, compute, *, overlapped):
    if n_batches < 0 or copy < 0 or compute < 0:
        raise ValueError("negative")
    if not overlapped:
        return n_batches * (copy + compute)
    return n_batches * max(copy, compute)
