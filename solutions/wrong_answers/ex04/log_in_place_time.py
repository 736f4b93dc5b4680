"""Reads the in-place time (the second time column) where the out-of-place one is asked for."""

LOSES = ["test_all_reduce_perf_bandwidths_agree_with_nccl_tests"]


def all_reduce_perf_bandwidths(log):
    ranks = len(re.findall(r"^#\s*Rank\s+\d+", log, flags=re.M))
    rows = []
    for line in log.splitlines():
        fields = line.split()
        if line.startswith("#") or len(fields) < 13 or not fields[0].isdigit():
            continue
        size, micros = int(fields[0]), float(fields[9])
        algbw = size / (micros * 1e-6) / 1e9
        rows.append([size, micros, algbw, algbw * 2 * (ranks - 1) / ranks])
    if not rows or not ranks:
        raise ValueError("no result rows")
    return {"ranks": ranks, "rows": rows}
