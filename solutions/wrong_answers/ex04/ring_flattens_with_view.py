"""Flattens with view(-1), which fails on a tensor that is not contiguous (a transposed view, a slice)."""

LOSES = ["test_ring_all_reduce_sums_along_a_ring"]

_ring = ring_all_reduce


def ring_all_reduce(tensor):
    flat = tensor.detach().view(-1)
    return _ring(flat).reshape(tensor.shape)
