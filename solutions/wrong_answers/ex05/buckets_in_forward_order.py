"""Fills the buckets in registration order, where DDP walks the parameters in reverse (gradient-ready order)."""

LOSES = ["test_bucket_assignment_matches_ddp"]


def bucket_assignment(sizes_in_bytes, bucket_cap_mb=25.0, first_bucket_mb=1.0):
    limit, cap = int(first_bucket_mb * MiB), int(bucket_cap_mb * MiB)
    buckets, current, filled = [], [], 0
    for index in range(len(sizes_in_bytes)):  # the first layer first
        current.append(index)
        filled += sizes_in_bytes[index]
        if filled >= limit:
            buckets.append(current)
            current, filled, limit = [], 0, cap
    if current:
        buckets.append(current)
    return buckets
