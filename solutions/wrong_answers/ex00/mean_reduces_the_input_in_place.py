"""All-reduces the caller's tensor itself (all_reduce works in place), so the input is changed."""

LOSES = ["test_all_reduce_mean_matches_single_process_mean"]


def all_reduce_mean(tensor):
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor / dist.get_world_size()
