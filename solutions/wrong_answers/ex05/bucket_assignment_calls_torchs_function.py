"""Hands the bucketing to torch's private _compute_bucket_assignment_by_size: right buckets, nothing learned."""

LOSES = ["test_bucket_assignment_matches_ddp"]


def bucket_assignment(sizes_in_bytes, bucket_cap_mb=25.0, first_bucket_mb=1.0):
    import torch
    import torch.distributed as dist

    sizes = list(sizes_in_bytes)
    if any(size < 0 for size in sizes) or bucket_cap_mb < 0 or first_bucket_mb < 0:
        raise ValueError("sizes and caps must be >= 0")
    if not sizes:
        return []
    grads = [torch.empty(1, dtype=torch.uint8).expand(size) if size else torch.empty(0, dtype=torch.uint8)
             for size in sizes]
    order = list(reversed(range(len(sizes))))
    buckets, _ = dist._compute_bucket_assignment_by_size(
        [grads[i] for i in order], [int(first_bucket_mb * 2**20), int(bucket_cap_mb * 2**20)], [False] * len(sizes),
        order)
    return [[int(i) for i in bucket] for bucket in buckets]
