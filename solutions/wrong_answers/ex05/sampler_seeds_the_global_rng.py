"""Shuffles with torch.manual_seed(seed + epoch): right indices, but the caller's global RNG state is reset."""

LOSES = ["test_sampler_indices_match_distributed_sampler"]


def sampler_indices(dataset_len, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    if num_replicas < 1 or not 0 <= rank < num_replicas or dataset_len < 0:
        raise ValueError(f"bad sampler arguments: num_replicas={num_replicas}, rank={rank}, dataset_len={dataset_len}")
    per_rank = dataset_len // num_replicas if drop_last else -(-dataset_len // num_replicas)
    total = per_rank * num_replicas
    if shuffle:
        torch.manual_seed(seed + epoch)
        indices = torch.randperm(dataset_len).tolist()
    else:
        indices = list(range(dataset_len))
    while len(indices) < total:
        indices += indices[:total - len(indices)]
    return indices[:total][rank::num_replicas]
