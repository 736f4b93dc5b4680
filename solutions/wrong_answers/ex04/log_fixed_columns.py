"""Reads the time from a fixed column (the sixth), which is right for newer nccl-tests only (older have no root)."""

LOSES = ["test_all_reduce_perf_bandwidths_agree_with_nccl_tests"]


def all_reduce_perf_bandwidths(log):
    ranks = sum(1 for line in log.splitlines() if re.match(r"#\s*Rank\s+\d+", line))
    rows = []
    for line in log.splitlines():
        fields = line.split()
        if line.startswith("#") or len(fields) < 6 or not fields[0].isdigit():
            continue
        size, micros = int(fields[0]), float(fields[5])
        algbw = size / (micros * 1e-6) / 1e9
        rows.append([size, micros, algbw, algbw * 2 * (ranks - 1) / ranks])
    if not rows or not ranks:
        raise ValueError("no device list or no result rows")
    return {"ranks": ranks, "rows": rows}
