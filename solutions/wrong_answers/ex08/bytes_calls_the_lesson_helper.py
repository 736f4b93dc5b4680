"""Borrows the lesson's course_lib.parallel.sharding.zero_memory instead of writing the formula."""

LOSES = ["test_model_state_bytes_gives_the_zero_papers_figure"]


def model_state_bytes(num_params, dp_degree, stage, optimizer_bytes_per_param=12):
    from course_lib.parallel.sharding import zero_memory

    result = zero_memory(num_params, dp_degree, stages=(stage,), k=optimizer_bytes_per_param)
    return float(result[stage]["total"] if isinstance(result, dict) else result)
