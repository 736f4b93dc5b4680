"""Takes the number of ranks from the header's nGpus, which counts GPUs per process, not in the job."""

LOSES = ["test_all_reduce_perf_bandwidths_agree_with_nccl_tests"]


def all_reduce_perf_bandwidths(log):
    match = re.search(r"nGpus\s+(\d+)", log)
    if match is None:
        raise ValueError("no nGpus in the header")
    ranks = int(match.group(1))
    rows = []
    for line in log.splitlines():
        fields = line.split()
        if line.startswith("#") or len(fields) < 13 or not fields[0].isdigit():
            continue
        size, micros = int(fields[0]), float(fields[5])
        algbw = size / (micros * 1e-6) / 1e9
        rows.append([size, micros, algbw, algbw * 2 * (ranks - 1) / ranks])
    if not rows:
        raise ValueError("no result rows")
    return {"ranks": ranks, "rows": rows}
