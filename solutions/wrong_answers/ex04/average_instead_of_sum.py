"""Divides the ring's result by the world size: an average, where the exercise asks for the sum."""

LOSES = ["test_ring_all_reduce_sums_along_a_ring"]

_ring_sum = ring_all_reduce


def ring_all_reduce(tensor):
    return _ring_sum(tensor) / dist.get_world_size()
