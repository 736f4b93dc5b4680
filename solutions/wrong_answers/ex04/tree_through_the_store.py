"""Broadcasts through the process group's key-value store instead of messages (no collective, no send)."""

LOSES = ["test_tree_broadcast_copies_the_source_in_log_rounds"]

_store_calls = [0]  # every rank counts its calls alike, so that the keys match


def tree_broadcast(tensor, src):
    import io
    from torch.distributed import distributed_c10d

    _store_calls[0] += 1
    store = distributed_c10d._get_default_store()
    key = f"bcast-{src}-{tuple(tensor.shape)}-{_store_calls[0]}"
    if dist.get_rank() == src:
        buffer = io.BytesIO()
        torch.save(tensor.clone(), buffer)
        store.set(key, buffer.getvalue())
    else:
        tensor.copy_(torch.load(io.BytesIO(store.get(key))))
    return tensor
