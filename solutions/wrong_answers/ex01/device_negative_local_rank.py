"""Checks only LOCAL_RANK < LOCAL_WORLD_SIZE, so LOCAL_RANK=-1 is taken (cuda:-1, or the CPU with too few GPUs)."""

LOSES = ["test_device_for_rank_rejects_bad_input_with_a_helpful_message"]


def device_for_rank(env, gpu_count):
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        if name not in env:
            raise ValueError(f"{name} is not set: start the ranks with torchrun, which sets LOCAL_RANK and LOCAL_WORLD_SIZE")
        try:
            int(env[name])
        except ValueError:
            raise ValueError(f"{name} must be a whole number, got {env[name]!r}") from None
    local_rank, local_world_size = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
    if local_world_size < 1 or local_rank >= local_world_size:
        raise ValueError(f"need LOCAL_RANK < LOCAL_WORLD_SIZE, got LOCAL_RANK={local_rank}, LOCAL_WORLD_SIZE={local_world_size}")
    if gpu_count < 0:
        raise ValueError("gpu_count must be 0 or more")
    return torch.device("cuda", local_rank) if gpu_count >= local_world_size else torch.device("cpu")
