"""Deals the shuffled indices out rank::num_replicas without padding: ranks get different numbers of samples."""

LOSES = ["test_sampler_indices_match_distributed_sampler"]


def sampler_indices(dataset_len, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    if num_replicas < 1 or not 0 <= rank < num_replicas or dataset_len < 0:
        raise ValueError("need num_replicas >= 1, 0 <= rank < num_replicas and dataset_len >= 0")
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        indices = torch.randperm(dataset_len, generator=generator).tolist()
    else:
        indices = list(range(dataset_len))
    if drop_last:
        indices = indices[:dataset_len // num_replicas * num_replicas]
    return indices[rank::num_replicas]
