"""Returns the all-reduced sum: all_reduce sums, and the mean still needs the division by the world size."""

LOSES = ["test_all_reduce_mean_matches_single_process_mean"]


def all_reduce_mean(tensor):
    total = tensor.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total
