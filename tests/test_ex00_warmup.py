"""Graded tests for exercise 00 (notebooks/00_welcome.ipynb)."""

import pytest
import torch

from course_lib.grading import exception_raised_by, run

CASES = [(10, 4), (7, 3), (3, 5), (0, 2), (16, 4), (1, 1)]


def _all_ranges(module, cases):
    return [[module.shard_range(n, w, r) for r in range(w)] for n, w in cases]


@pytest.mark.points(2)
def test_shard_range_matches_tensor_split():
    got = run("ex00", _all_ranges, CASES)
    for (n, w), ranges in zip(CASES, got):
        expected = [(int(c[0]), int(c[-1]) + 1) if len(c) else None for c in torch.tensor_split(torch.arange(n), w)]
        # Empty pieces: only their length (zero) is defined, and consecutive ranges must touch.
        for rank, ((start, stop), want) in enumerate(zip(ranges, expected)):
            if want is None:
                assert stop == start, f"{n} items over {w} ranks: rank {rank} should own nothing, got {(start, stop)}"
            else:
                assert (start, stop) == want, f"{n} items over {w} ranks: rank {rank}"
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), f"{n} over {w}: ranges must touch"


def _bad_inputs(module):
    cases = [(10, 0, 0), (10, 2, 2), (10, 2, -1), (-1, 2, 0)]
    return [exception_raised_by(module.shard_range, *args)[0] for args in cases]


@pytest.mark.points(1)
def test_shard_range_rejects_bad_input():
    assert run("ex00", _bad_inputs) == ["ValueError"] * 4


def _mean_in_rank(rank, world_size, module, length):
    tensor = torch.arange(length, dtype=torch.float32) * (rank + 1)
    before = tensor.clone()
    mean = module.all_reduce_mean(tensor)
    return {"mean": mean, "input_unchanged": bool(torch.equal(tensor, before))}


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_all_reduce_mean_matches_single_process_mean(world_size):
    results = run("ex00", _mean_in_rank, 5, world_size=world_size)
    inputs = torch.stack([torch.arange(5, dtype=torch.float32) * (r + 1) for r in range(world_size)])
    expected = inputs.mean(dim=0)
    for rank, result in enumerate(results):
        torch.testing.assert_close(result["mean"], expected, msg=f"rank {rank}")
        assert result["input_unchanged"], f"rank {rank}: the input tensor was modified"
