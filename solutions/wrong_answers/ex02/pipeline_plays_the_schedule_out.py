"""pipeline_time plays the schedule out batch by batch: right, but a loop where a formula is asked for (a billion batches time out)."""

LOSES = ["test_pipeline_time_is_a_formula"]


def pipeline_time(n_batches, copy, compute, *, overlapped):
    if n_batches < 0 or copy < 0 or compute < 0:
        raise ValueError("negative")
    copy_done = compute_done = 0.0
    for _ in range(n_batches):
        copy_done = (copy_done if overlapped else compute_done) + copy
        compute_done = max(copy_done, compute_done) + compute
    return compute_done
