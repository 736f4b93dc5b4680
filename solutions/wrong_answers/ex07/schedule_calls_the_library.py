"""Plays the schedule out with the lesson's course_lib.parallel.pipeline.simulate: the tests switch it off."""

LOSES = ["test_pipeline_schedule_matches_a_simulation"]


def pipeline_schedule(stages, micro_batches, kind="1f1b"):
    from course_lib.parallel.pipeline import simulate

    _check_count("stages", stages, "pipeline stages")
    _check_count("micro_batches", micro_batches, "micro-batches")
    if kind not in KINDS:
        raise ValueError(f"kind is {kind!r}: pass one of {', '.join(repr(k) for k in KINDS)}")
    ops = simulate(kind, stages, micro_batches, forward_time=1.0, backward_time=1.0)
    return sorted((int(op.start), op.stage, op.micro_batch, op.kind) for op in ops)
