"""Any kind that is not "gpipe" gets 1F1B: a typo or an unsupported schedule goes unnoticed."""

LOSES = ["test_pipeline_schedule_rejects_bad_arguments"]

_solution_pipeline_schedule = pipeline_schedule


def pipeline_schedule(stages, micro_batches, kind="1f1b"):
    return _solution_pipeline_schedule(stages, micro_batches, "gpipe" if kind == "gpipe" else "1f1b")
