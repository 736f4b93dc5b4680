"""Averages in float64 and casts back to the input's dtype: an integer tensor's mean is cut to integers, not float32."""

LOSES = ["test_all_reduce_mean_keeps_shape_and_dtype"]


def all_reduce_mean(tensor):
    total = tensor.to(torch.float64, copy=True)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return (total / dist.get_world_size()).to(tensor.dtype)
