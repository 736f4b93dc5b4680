"""Checks nothing: a rank equal to num_replicas gets an empty or short list instead of a ValueError."""

LOSES = ["test_sampler_indices_rejects_bad_ranks"]


def sampler_indices(dataset_len, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    per_rank = dataset_len // max(num_replicas, 1) if drop_last else -(-dataset_len // max(num_replicas, 1))
    total = per_rank * num_replicas
    indices = list(range(max(dataset_len, 0)))
    if shuffle and dataset_len > 0:
        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        indices = torch.randperm(dataset_len, generator=generator).tolist()
    while indices and len(indices) < total:
        indices += indices[:total - len(indices)]
    return indices[:max(total, 0)][rank::max(num_replicas, 1)]
