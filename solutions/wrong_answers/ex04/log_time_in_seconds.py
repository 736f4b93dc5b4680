"""Divides the size by the time as printed, forgetting that nccl-tests prints microseconds."""

LOSES = ["test_all_reduce_perf_bandwidths_agree_with_nccl_tests"]


def all_reduce_perf_bandwidths(log):
    ranks = len(re.findall(r"^#\s*Rank\s+\d+", log, flags=re.M))
    rows = []
    for line in log.splitlines():
        fields = line.split()
        if line.startswith("#") or len(fields) < 13 or not fields[0].isdigit():
            continue
        size, micros = int(fields[0]), float(fields[5])
        algbw = size / micros / 1e9
        rows.append([size, micros, algbw, algbw * 2 * (ranks - 1) / ranks])
    if not rows or not ranks:
        raise ValueError("no result rows")
    return {"ranks": ranks, "rows": rows}
