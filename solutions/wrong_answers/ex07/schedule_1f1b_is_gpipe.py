"""Treats 1F1B as GPipe: the same bubble, but stage 0 holds every micro-batch's activations."""

LOSES = ["test_pipeline_schedule_matches_a_simulation", "test_pipeline_schedule_bubble_and_activation_memory"]

_solution_pipeline_schedule = pipeline_schedule


def pipeline_schedule(stages, micro_batches, kind="1f1b"):
    if kind in KINDS:
        kind = "gpipe"
    return _solution_pipeline_schedule(stages, micro_batches, kind)
