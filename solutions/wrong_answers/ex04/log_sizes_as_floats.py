"""Reads every number of a row with float(), so the sizes come back as floats, not the ints promised."""

LOSES = ["test_all_reduce_perf_bandwidths_agree_with_nccl_tests"]

_read_log = all_reduce_perf_bandwidths


def all_reduce_perf_bandwidths(log):
    result = _read_log(log)
    return {"ranks": result["ranks"], "rows": [[float(x) for x in row] for row in result["rows"]]}
