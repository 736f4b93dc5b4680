"""Reads env["LOCAL_RANK"] directly: outside torchrun that is a bare KeyError, not a ValueError saying what to do."""

LOSES = ["test_device_for_rank_rejects_bad_input_with_a_helpful_message"]


def device_for_rank(env, gpu_count):
    local_rank, local_world_size = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"need 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE, got local_rank={local_rank}")
    if gpu_count < 0:
        raise ValueError("gpu_count must be 0 or more")
    return torch.device("cuda", local_rank) if gpu_count >= local_world_size else torch.device("cpu")
