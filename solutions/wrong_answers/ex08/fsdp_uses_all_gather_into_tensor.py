"""All-gathers with dist.all_gather_into_tensor, which torch 2.14 deprecates with a FutureWarning."""

LOSES = ["test_mini_fsdp_matches_one_process_on_the_whole_batch"]


def _all_gather_weight(shard, rows, dtype, world_size):
    send = shard.detach().to(dtype).contiguous()
    full = send.new_empty((send.shape[0] * world_size,) + tuple(send.shape[1:]))
    dist.all_gather_into_tensor(full, send)
    return full[:rows]
