"""Takes any real size and truncates it with int(): 4096.5 bytes becomes 4096 instead of an error."""

LOSES = ["test_bucket_assignment_rejects_bad_input"]

_bucket_assignment = bucket_assignment


def bucket_assignment(sizes_in_bytes, bucket_cap_mb=25.0, first_bucket_mb=1.0):
    sizes = []
    for i, size in enumerate(sizes_in_bytes):
        if isinstance(size, bool) or not isinstance(size, numbers.Real) or size < 0:
            raise ValueError(f"sizes_in_bytes[{i}] is {size!r}: pass each gradient's size in bytes, 0 or more")
        sizes.append(int(size))
    return _bucket_assignment(sizes, bucket_cap_mb, first_bucket_mb)
