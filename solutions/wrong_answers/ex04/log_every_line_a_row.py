"""Treats every line that does not start with # as a result row, so the ssh warning mpirun printed breaks it."""

LOSES = ["test_all_reduce_perf_bandwidths_agree_with_nccl_tests"]


def all_reduce_perf_bandwidths(log):
    ranks = len(re.findall(r"^#\s*Rank\s+\d+", log, flags=re.M))
    rows = []
    for line in log.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        fields = line.split()
        size, micros = int(fields[0]), float(fields[5])
        algbw = size / (micros * 1e-6) / 1e9
        rows.append([size, micros, algbw, algbw * 2 * (ranks - 1) / ranks])
    if not rows or not ranks:
        raise ValueError("no result rows")
    return {"ranks": ranks, "rows": rows}
