"""All-gathers the fp32 shards and casts the full weight afterwards: twice the bytes on the wire."""

LOSES = ["test_mini_fsdp_computes_in_bfloat16_with_float32_master_weights"]


class _GatherWeight(_GatherWeight):  # noqa: F811
    @staticmethod
    def forward(ctx, shard, rows, compute_dtype, fsdp):
        send = shard.detach().contiguous()
        chunks = [torch.empty_like(send) for _ in range(fsdp._world_size)]
        dist.all_gather(chunks, send)
        ctx.fsdp, ctx.shard = fsdp, shard
        return torch.cat(chunks)[:rows].to(compute_dtype or shard.dtype)
