"""All-gathers the fp32 shards and casts the full weight afterwards: twice the bytes on the wire."""

LOSES = ["test_mini_fsdp_computes_in_bfloat16_with_float32_master_weights"]


def _all_gather_weight(shard, rows, dtype, world_size):
    send = shard.detach().contiguous()
    chunks = [torch.empty_like(send) for _ in range(world_size)]
    dist.all_gather(chunks, send)
    return torch.cat(chunks)[:rows].to(dtype)
