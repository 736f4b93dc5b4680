"""Accepts numpy's integers but adds them up as they come: a total of numpy.uint16 sizes wraps around at 65536."""

LOSES = ["test_bucket_assignment_accepts_numpy_integers"]


def bucket_assignment(sizes_in_bytes, bucket_cap_mb=25.0, first_bucket_mb=1.0):
    for i, size in enumerate(sizes_in_bytes):
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0:
            raise ValueError(f"sizes_in_bytes[{i}] is {size!r}: pass each gradient's size in bytes as a whole "
                             "number, 0 or more (p.numel() * p.element_size())")
    for name, value in (("bucket_cap_mb", bucket_cap_mb), ("first_bucket_mb", first_bucket_mb)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} is {value!r}: pass a bucket size in MiB, a finite number 0 or more")
    limit, cap = int(first_bucket_mb * MiB), int(bucket_cap_mb * MiB)
    buckets, current, filled = [], [], None
    for index in reversed(range(len(sizes_in_bytes))):
        current.append(index)
        size = sizes_in_bytes[index]
        filled = size if filled is None else filled + size  # numpy + numpy stays in the narrow dtype
        if filled >= limit:
            buckets.append(current)
            current, filled, limit = [], None, cap
    if current:
        buckets.append(current)
    return buckets
