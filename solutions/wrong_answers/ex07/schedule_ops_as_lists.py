"""Returns each op as a list [time_step, stage, micro_batch, op], not a tuple."""

LOSES = ["test_pipeline_schedule_matches_a_simulation"]

_solution_pipeline_schedule = pipeline_schedule


def pipeline_schedule(stages, micro_batches, kind="1f1b"):
    return [list(op) for op in _solution_pipeline_schedule(stages, micro_batches, kind)]
