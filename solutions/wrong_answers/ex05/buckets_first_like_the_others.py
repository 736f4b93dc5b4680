"""Gives the first bucket the same limit as the others, ignoring first_bucket_mb (DDP's small first bucket)."""

LOSES = ["test_bucket_assignment_matches_ddp"]

_bucket_assignment = bucket_assignment


def bucket_assignment(sizes_in_bytes, bucket_cap_mb=25.0, first_bucket_mb=1.0):
    return _bucket_assignment(sizes_in_bytes, bucket_cap_mb, bucket_cap_mb)
