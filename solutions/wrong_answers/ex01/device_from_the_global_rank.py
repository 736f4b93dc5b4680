"""Uses the global RANK as the GPU index: on the second machine rank 7 asks for cuda:7 of a 4-GPU machine."""

LOSES = ["test_device_for_rank_uses_the_local_rank"]

_solution_device_for_rank = device_for_rank


def device_for_rank(env, gpu_count):
    device = _solution_device_for_rank(env, gpu_count)  # the checks and the CPU fallback
    if device.type == "cuda":
        return torch.device("cuda", int(env.get("RANK", env["LOCAL_RANK"])))
    return device
