"""Gives each rank a contiguous block of the padded list, where DistributedSampler interleaves (rank::n)."""

LOSES = ["test_sampler_indices_match_distributed_sampler"]


def sampler_indices(dataset_len, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    if num_replicas < 1 or not 0 <= rank < num_replicas or dataset_len < 0:
        raise ValueError("need num_replicas >= 1, 0 <= rank < num_replicas and dataset_len >= 0")
    per_rank = dataset_len // num_replicas if drop_last else -(-dataset_len // num_replicas)
    total = per_rank * num_replicas
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        indices = torch.randperm(dataset_len, generator=generator).tolist()
    else:
        indices = list(range(dataset_len))
    while len(indices) < total:
        indices += indices[:total - len(indices)]
    return indices[rank * per_rank:(rank + 1) * per_rank]
