"""Gathers every rank's tensor and takes torch.stack(...).mean(0): mean() refuses integer tensors."""

LOSES = ["test_all_reduce_mean_keeps_shape_and_dtype"]


def all_reduce_mean(tensor):
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor.contiguous())
    return torch.stack(gathered).mean(dim=0)
