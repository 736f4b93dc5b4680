"""Gathers every rank's whole tensor and sums the list: the right sum, with world-size times the ring's traffic."""

LOSES = ["test_ring_all_reduce_sums_along_a_ring"]


def ring_all_reduce(tensor):
    return torch.stack(all_gather_p2p(tensor)).sum(dim=0)
