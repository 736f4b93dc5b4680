"""Buckets whatever it is given: a negative size or cap gives nonsense buckets, not a ValueError naming the argument."""

LOSES = ["test_bucket_assignment_rejects_bad_input"]


def bucket_assignment(sizes_in_bytes, bucket_cap_mb=25.0, first_bucket_mb=1.0):
    limit, cap = int(first_bucket_mb * MiB), int(bucket_cap_mb * MiB)  # int(nan) raises, but says nothing useful
    buckets, current, filled = [], [], 0
    for index in reversed(range(len(sizes_in_bytes))):
        current.append(index)
        filled += sizes_in_bytes[index]
        if filled >= limit:
            buckets.append(current)
            current, filled, limit = [], 0, cap
    if current:
        buckets.append(current)
    return buckets
