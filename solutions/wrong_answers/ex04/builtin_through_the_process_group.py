"""Calls the process group object's own allreduce method: the built-in collective by another door."""

LOSES = ["test_ring_all_reduce_sums_along_a_ring"]


def ring_all_reduce(tensor):
    total = tensor.detach().clone()
    dist.group.WORLD.allreduce([total]).wait()
    return total
