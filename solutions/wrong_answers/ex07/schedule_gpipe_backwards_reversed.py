"""GPipe's backwards run from the last micro-batch to the first (the one whose forward ended last goes first)."""

LOSES = ["test_pipeline_schedule_matches_a_simulation", "test_pipeline_schedule_keeps_every_dependency"]

_solution_pipeline_schedule = pipeline_schedule


def pipeline_schedule(stages, micro_batches, kind="1f1b"):
    ops = _solution_pipeline_schedule(stages, micro_batches, kind)
    if kind != "gpipe":
        return ops
    m = micro_batches
    return sorted((t, s, j if op == "F" else m - 1 - j, op) for t, s, j, op in ops)
