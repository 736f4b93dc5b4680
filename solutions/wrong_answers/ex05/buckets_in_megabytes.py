"""Counts a MB as 10**6 bytes, where DDP's bucket_cap_mb is in MiB (2**20 bytes)."""

LOSES = ["test_bucket_assignment_matches_ddp"]

_bucket_assignment = bucket_assignment


def bucket_assignment(sizes_in_bytes, bucket_cap_mb=25.0, first_bucket_mb=1.0):
    return _bucket_assignment(sizes_in_bytes, bucket_cap_mb * 10**6 / MiB, first_bucket_mb * 10**6 / MiB)
