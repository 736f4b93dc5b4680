"""All-reduces with ReduceOp.AVG: gloo averages floating-point tensors but refuses integer ones."""

LOSES = ["test_all_reduce_mean_keeps_shape_and_dtype"]


def all_reduce_mean(tensor):
    total = tensor.clone()
    dist.all_reduce(total, op=dist.ReduceOp.AVG)
    return total
