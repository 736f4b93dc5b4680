"""Returns the string "cuda:1" instead of a torch.device."""

LOSES = ["test_device_for_rank_uses_the_local_rank"]

_solution_device_for_rank = device_for_rank


def device_for_rank(env, gpu_count):
    return str(_solution_device_for_rank(env, gpu_count))
