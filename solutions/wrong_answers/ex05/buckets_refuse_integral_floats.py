"""Refuses every float size, 4096.0 too, though a size is a count and an integral float is a whole number."""

LOSES = ["test_bucket_assignment_matches_ddp", "test_bucket_assignment_accepts_numpy_integers"]

_bucket_assignment = bucket_assignment


def bucket_assignment(sizes_in_bytes, bucket_cap_mb=25.0, first_bucket_mb=1.0):
    for i, size in enumerate(sizes_in_bytes):
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0:
            raise ValueError(f"sizes_in_bytes[{i}] is {size!r}: pass each gradient's size in bytes as a whole "
                             "number, 0 or more")
    return _bucket_assignment(sizes_in_bytes, bucket_cap_mb, first_bucket_mb)
