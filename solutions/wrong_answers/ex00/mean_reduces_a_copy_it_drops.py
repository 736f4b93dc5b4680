"""All-reduces a temporary copy and then divides the original: the reduced copy is thrown away."""

LOSES = ["test_all_reduce_mean_matches_single_process_mean"]


def all_reduce_mean(tensor):
    dist.all_reduce(tensor.clone(), op=dist.ReduceOp.SUM)
    return tensor / dist.get_world_size()
