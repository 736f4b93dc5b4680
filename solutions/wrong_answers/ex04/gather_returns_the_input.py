"""Puts the caller's own input tensor itself at its index, where a new tensor (a copy) is promised."""

LOSES = ["test_all_gather_p2p_returns_every_rank_in_order"]

_gather = all_gather_p2p


def all_gather_p2p(tensor):
    out = _gather(tensor)
    out[dist.get_rank()] = tensor
    return out
