"""Shares the GPUs round robin (cuda:LOCAL_RANK % gpu_count) when there are fewer GPUs than ranks; NCCL refuses that."""

LOSES = ["test_device_for_rank_uses_the_local_rank"]

_solution_device_for_rank = device_for_rank


def device_for_rank(env, gpu_count):
    device = _solution_device_for_rank(env, gpu_count)
    if device.type == "cpu" and gpu_count > 0:
        return torch.device("cuda", int(env["LOCAL_RANK"]) % gpu_count)
    return device
