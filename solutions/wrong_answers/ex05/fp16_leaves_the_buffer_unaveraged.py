"""Returns a new float32 tensor of the averaged values but leaves bucket.buffer() holding this rank's own gradients."""

LOSES = ["test_fp16_compress_hook_future_holds_the_mean"]


def fp16_compress_hook(process_group, bucket):
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.float16).div_(group.size())
    work = dist.all_reduce(compressed, group=group, async_op=True)
    return work.get_future().then(lambda future: future.value()[0].to(buffer.dtype))
