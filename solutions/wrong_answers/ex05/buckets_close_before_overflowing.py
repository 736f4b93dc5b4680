"""Opens a new bucket before a parameter that would pass the limit; DDP adds it, then closes the bucket."""

LOSES = ["test_bucket_assignment_matches_ddp"]


def bucket_assignment(sizes_in_bytes, bucket_cap_mb=25.0, first_bucket_mb=1.0):
    limit, cap = int(first_bucket_mb * MiB), int(bucket_cap_mb * MiB)
    buckets, current, filled = [], [], 0
    for index in reversed(range(len(sizes_in_bytes))):
        if current and filled + sizes_in_bytes[index] > limit:  # never let a bucket exceed its limit
            buckets.append(current)
            current, filled, limit = [], 0, cap
        current.append(index)
        filled += sizes_in_bytes[index]
    if current:
        buckets.append(current)
    return buckets
