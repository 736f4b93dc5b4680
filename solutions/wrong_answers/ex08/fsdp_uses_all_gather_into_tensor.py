"""All-gathers with dist.all_gather_into_tensor, which torch 2.14 deprecates with a FutureWarning."""

LOSES = ["test_mini_fsdp_matches_one_process_on_the_whole_batch"]


class _GatherWeight(_GatherWeight):  # noqa: F811
    @staticmethod
    def forward(ctx, shard, rows, compute_dtype, fsdp):
        send = shard.detach().to(compute_dtype or shard.dtype).contiguous()
        full = send.new_empty((send.shape[0] * fsdp._world_size,) + tuple(send.shape[1:]))
        dist.all_gather_into_tensor(full, send)
        ctx.fsdp, ctx.shard = fsdp, shard
        return full[:rows]
