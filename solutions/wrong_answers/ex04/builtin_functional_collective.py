"""Uses the functional all_reduce of torch.distributed._functional_collectives (what torch.compile traces)."""

LOSES = ["test_ring_all_reduce_sums_along_a_ring"]


def ring_all_reduce(tensor):
    import torch.distributed._functional_collectives as funcol

    return funcol.wait_tensor(funcol.all_reduce(tensor.detach().clone(), "sum", dist.group.WORLD))
