"""Divides by 2, the world size of the examples, instead of dist.get_world_size()."""

LOSES = ["test_all_reduce_mean_matches_single_process_mean"]


def all_reduce_mean(tensor):
    total = tensor.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / 2
