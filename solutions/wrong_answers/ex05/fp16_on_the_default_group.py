"""Ignores the process_group DDP passes and all-reduces on the default group, dividing by its size."""

LOSES = ["test_fp16_compress_hook_matches_torchs_hook"]


def fp16_compress_hook(process_group, bucket):
    buffer = bucket.buffer()
    compressed = buffer.to(torch.float16).div_(dist.get_world_size())
    work = dist.all_reduce(compressed, async_op=True)

    def decompress(future):
        buffer.copy_(future.value()[0])
        return buffer

    return work.get_future().then(decompress)
