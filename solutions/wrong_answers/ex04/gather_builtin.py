"""Calls the built-in all_gather through torch.distributed.distributed_c10d instead of sending messages."""

LOSES = ["test_all_gather_p2p_returns_every_rank_in_order"]


def all_gather_p2p(tensor):
    from torch.distributed import distributed_c10d

    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    distributed_c10d.all_gather(out, tensor.contiguous())
    return out
