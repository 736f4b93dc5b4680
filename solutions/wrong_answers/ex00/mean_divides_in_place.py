"""Divides the reduced copy in place (total /= world_size), which an integer tensor cannot hold."""

LOSES = ["test_all_reduce_mean_keeps_shape_and_dtype"]


def all_reduce_mean(tensor):
    total = tensor.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    total /= dist.get_world_size()
    return total
