"""Returns the ops stage by stage (sorted by stage, then time step) instead of by (time_step, stage)."""

LOSES = ["test_pipeline_schedule_matches_a_simulation", "test_pipeline_schedule_keeps_every_dependency"]

_solution_pipeline_schedule = pipeline_schedule


def pipeline_schedule(stages, micro_batches, kind="1f1b"):
    return sorted(_solution_pipeline_schedule(stages, micro_batches, kind), key=lambda op: (op[1], op[0]))
