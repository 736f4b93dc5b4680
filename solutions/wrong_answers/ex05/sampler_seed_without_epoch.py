"""Seeds the shuffle with seed alone, forgetting the epoch: every epoch sees the same order (set_epoch does nothing)."""

LOSES = ["test_sampler_indices_match_distributed_sampler"]

_sampler_indices = sampler_indices


def sampler_indices(dataset_len, num_replicas, rank, *, shuffle=True, seed=0, epoch=0, drop_last=False):
    return _sampler_indices(dataset_len, num_replicas, rank, shuffle=shuffle, seed=seed, epoch=0, drop_last=drop_last)
