"""Calls allreduce on the group's gloo backend object directly, below every torch.distributed function."""

LOSES = ["test_ring_all_reduce_sums_along_a_ring"]


def ring_all_reduce(tensor):
    total = tensor.detach().clone()
    dist.group.WORLD._get_backend(total.device).allreduce([total]).wait()
    return total
