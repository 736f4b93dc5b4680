"""Returns the input itself when there is one rank (the mean of one tensor is that tensor), not a new tensor."""

LOSES = ["test_all_reduce_mean_matches_single_process_mean"]


def all_reduce_mean(tensor):
    if dist.get_world_size() == 1:
        return tensor
    total = tensor.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / dist.get_world_size()
