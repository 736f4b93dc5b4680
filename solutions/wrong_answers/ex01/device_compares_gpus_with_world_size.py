"""Compares the GPUs with WORLD_SIZE (all machines' ranks): on the second of two 4-GPU machines every rank gets the CPU."""

LOSES = ["test_device_for_rank_uses_the_local_rank"]

_solution_device_for_rank = device_for_rank


def device_for_rank(env, gpu_count):
    device = _solution_device_for_rank(env, gpu_count)  # the checks
    ranks = int(env.get("WORLD_SIZE", env["LOCAL_WORLD_SIZE"]))
    return torch.device("cuda", int(env["LOCAL_RANK"])) if gpu_count >= ranks else torch.device("cpu")
