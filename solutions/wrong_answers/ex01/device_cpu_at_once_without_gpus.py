"""Returns the CPU at once when there is no GPU, before checking LOCAL_RANK: rank 5 of 2 passes unnoticed."""

LOSES = ["test_device_for_rank_rejects_bad_input_with_a_helpful_message"]

_solution_device_for_rank = device_for_rank


def device_for_rank(env, gpu_count):
    if gpu_count == 0:
        return torch.device("cpu")  # nothing to choose from
    return _solution_device_for_rank(env, gpu_count)
