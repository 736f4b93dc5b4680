"""All-reduces on the group it is given but divides by the default group's size: wrong on a subgroup of 2 of 3 ranks."""

LOSES = ["test_fp16_compress_hook_future_holds_the_mean"]


def fp16_compress_hook(process_group, bucket):
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.float16).div_(dist.get_world_size())
    work = dist.all_reduce(compressed, group=group, async_op=True)

    def decompress(future):
        buffer.copy_(future.value()[0])
        return buffer

    return work.get_future().then(decompress)
