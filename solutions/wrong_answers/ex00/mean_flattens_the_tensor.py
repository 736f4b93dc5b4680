"""Flattens the copy it reduces (all_reduce wants contiguous memory) and returns it flat: a (2, 3) mean comes back (6,)."""

LOSES = ["test_all_reduce_mean_matches_single_process_mean", "test_all_reduce_mean_keeps_shape_and_dtype"]


def all_reduce_mean(tensor):
    total = tensor.reshape(-1).clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / dist.get_world_size()
