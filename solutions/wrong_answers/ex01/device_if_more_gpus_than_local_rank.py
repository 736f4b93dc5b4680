"""Gives rank r a GPU whenever gpu_count > LOCAL_RANK: with 2 GPUs and 4 ranks, two ranks get GPUs and two do not."""

LOSES = ["test_device_for_rank_uses_the_local_rank"]


def device_for_rank(env, gpu_count):
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        if name not in env:
            raise ValueError(f"{name} is not set: start the ranks with torchrun")
        if not str(env[name]).isdigit():
            raise ValueError(f"{name} must be a whole number (local_rank), got {env[name]!r}")
    local_rank, local_world_size = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"need 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE (local_rank={local_rank})")
    if gpu_count < 0:
        raise ValueError("gpu_count must be 0 or more")
    return torch.device("cuda", local_rank) if gpu_count > local_rank else torch.device("cpu")
