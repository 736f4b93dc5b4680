"""Graded tests for exercise 00 (notebooks/00_welcome.ipynb).

Each test runs a fixed example first (an untouched stub fails there at once), then cases Hypothesis draws.
"""

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from course_lib.grading import exception_raised_by, run

# ---------------------------------------------------------------- shard_range

SPLITS = [(10, 4), (7, 3), (3, 5), (0, 2), (16, 4), (1, 1), (0, 1), (2, 3)]  # (num_items, world_size)


def _all_ranges(module, cases):
    """Every rank's answer, described: its type, its items' types, and its values as ints (when they convert)."""
    out = []
    for num_items, world_size in cases:
        row = []
        for rank in range(world_size):
            got = module.shard_range(num_items, world_size, rank)
            items = list(got) if isinstance(got, (tuple, list)) else []
            try:
                values = [int(x) for x in items]
            except (TypeError, ValueError, RuntimeError):
                values = None
            row.append({"type": type(got).__name__, "item_types": [type(x).__name__ for x in items],
                        "values": values, "repr": repr(got)[:80]})
        out.append(row)
    return out


def _expected_ranges(num_items, world_size):
    """torch.tensor_split's piece sizes, laid end to end: (start, stop) per rank."""
    sizes = [len(piece) for piece in torch.tensor_split(torch.arange(num_items), world_size)]
    starts = [sum(sizes[:rank]) for rank in range(world_size)]
    return [(start, start + size) for start, size in zip(starts, sizes)]


@pytest.mark.points(2)
@settings(max_examples=10)
@given(cases=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 9)), min_size=1, max_size=6))
@example(cases=SPLITS)
def test_shard_range_matches_tensor_split(cases):
    got = run("ex00", _all_ranges, cases)
    for (num_items, world_size), ranges in zip(cases, got):
        for rank, (answer, want) in enumerate(zip(ranges, _expected_ranges(num_items, world_size))):
            call = f"shard_range({num_items}, {world_size}, {rank})"
            assert answer["values"] == list(want), f"{call} should be {want}, got {answer['repr']}"
            assert answer["type"] == "tuple" and answer["item_types"] == ["int", "int"], (
                f"{call} should return a tuple of two Python ints such as {want}, got {answer['repr']} "
                f"(a {answer['type']} of {', '.join(answer['item_types']) or 'nothing'})")


BAD_SPLITS = [  # (num_items, world_size, rank), each must raise ValueError
    (10, 0, 0), (10, 2, 2), (10, 2, -1), (-1, 2, 0),
    (10, 1, 1), (10, 1, -1), (-3, 1, 0),  # one rank: the checks still apply
    (0, 2, 5), (0, 0, 0), (0, 1, -1),  # no items: the checks still apply
    (5, -2, 0), (5, -2, -1),
]


def _bad_inputs(module, cases):
    return [exception_raised_by(module.shard_range, *args)[0] for args in cases]


def _out_of_range_rank(world_size):
    rank = st.one_of(st.integers(-5, -1), st.integers(world_size, world_size + 3))
    return st.tuples(st.integers(0, 20), st.just(world_size), rank)


def _negative_items(world_size):
    return st.tuples(st.integers(-20, -1), st.just(world_size), st.integers(0, world_size - 1))


BAD_SPLIT = st.one_of(
    st.tuples(st.integers(-5, 20), st.integers(-3, 0), st.integers(-2, 3)),  # world_size < 1
    st.integers(1, 6).flatmap(_out_of_range_rank),
    st.integers(1, 6).flatmap(_negative_items),
)


@pytest.mark.points(1)
@settings(max_examples=8)
@given(cases=st.lists(BAD_SPLIT, min_size=1, max_size=8))
@example(cases=BAD_SPLITS)
def test_shard_range_rejects_bad_input(cases):
    for args, kind in zip(cases, run("ex00", _bad_inputs, cases)):
        assert kind == "ValueError", f"shard_range{args}: expected ValueError, got {kind}"


# ---------------------------------------------------------------- all_reduce_mean


def _mean_in_rank(rank, world_size, module, cases):
    """Each case is one tensor per rank; this rank averages its own and reports what it saw."""
    results = []
    for inputs in cases:
        tensor = inputs[rank]
        before, strides = tensor.clone(), tensor.stride()
        mean = module.all_reduce_mean(tensor)
        is_tensor = isinstance(mean, torch.Tensor)
        result = {"type": type(mean).__name__, "same_object": mean is tensor,
                  "mean": mean.detach().clone() if is_tensor else None}
        result["input_unchanged"] = bool(tensor.dtype == before.dtype and tensor.shape == before.shape
                                         and tensor.stride() == strides and torch.equal(tensor, before))
        aliased = False
        if is_tensor and mean is not tensor and mean.numel() > 0 and result["input_unchanged"]:
            mean.detach().fill_(7)  # writing into the mean must not write into the input
            aliased = not torch.equal(tensor, before)
        result["aliased"] = aliased
        results.append(result)
    return results


def _expected_mean(inputs):
    """The mean over ranks, computed in float64 and given the dtype `/` gives (integers: float32)."""
    total = torch.stack([t.to(torch.float64) for t in inputs]).sum(dim=0) / len(inputs)
    return total.to(inputs[0].dtype if inputs[0].is_floating_point() else torch.float32)


def _check_means(world_size, cases, results):
    for rank, answers in enumerate(results):
        for inputs, answer in zip(cases, answers):
            shape, dtype = list(inputs[rank].shape), inputs[rank].dtype
            where = f"{world_size} rank(s), a {dtype} tensor of shape {shape}, on rank {rank}"
            assert answer["type"] == "Tensor", f"{where}: return a torch.Tensor, got a {answer['type']}"
            assert answer["input_unchanged"], f"{where}: the input tensor was modified; reduce a copy"
            assert not answer["same_object"], f"{where}: return a new tensor, not the input itself"
            assert not answer["aliased"], f"{where}: the mean shares memory with the input; return a new tensor"
            want, got = _expected_mean(inputs), answer["mean"]
            assert list(got.shape) == list(want.shape), f"{where}: the mean should have shape {shape}, got {list(got.shape)}"
            assert got.dtype == want.dtype, f"{where}: the mean should be {want.dtype}, got {got.dtype}"
            low_precision = want.dtype in (torch.bfloat16, torch.float16)
            tolerance = {"atol": 0.02, "rtol": 0.02} if low_precision else {}
            torch.testing.assert_close(got, want, **tolerance,
                                       msg=lambda m: f"{where}: the mean is wrong. {m}")


@st.composite
def _rank_tensors(draw, world_size, dtypes):
    """One case: `world_size` tensors of one shape and dtype, with small values whose sums are exact in bfloat16."""
    shape = draw(st.lists(st.integers(0, 3), max_size=3))  # [] is a 0-d tensor; a 0 makes it empty
    dtype = draw(st.sampled_from(dtypes))
    transposed = len(shape) >= 2 and draw(st.booleans())
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    tensors = []
    for _ in range(world_size):
        values = torch.randint(-8, 9, shape, generator=generator)
        tensor = (values / 4).to(dtype) if dtype.is_floating_point else values.to(dtype)
        if transposed:  # the same values, laid out transposed in memory
            tensor = tensor.transpose(-1, -2).contiguous().transpose(-1, -2)
        tensors.append(tensor)
    return tensors


@st.composite
def _mean_example(draw, dtypes, world_sizes=st.integers(1, 5)):
    world_size = draw(world_sizes)
    return world_size, draw(st.lists(_rank_tensors(world_size, dtypes), min_size=1, max_size=3))


def _arange_example(world_size):
    return world_size, [[torch.arange(5, dtype=torch.float32) * (rank + 1) for rank in range(world_size)]]


@pytest.mark.points(2)
@settings(max_examples=8)
@given(world_size_and_cases=_mean_example([torch.float32]))
@example(world_size_and_cases=_arange_example(1))
@example(world_size_and_cases=_arange_example(2))
@example(world_size_and_cases=_arange_example(3))
def test_all_reduce_mean_matches_single_process_mean(world_size_and_cases):
    world_size, cases = world_size_and_cases
    _check_means(world_size, cases, run("ex00", _mean_in_rank, cases, world_size=world_size))


def _dtype_example():
    make = [lambda r: torch.tensor(r + 0.5, dtype=torch.float64),  # 0-d
            lambda r: torch.arange(6).reshape(2, 3) * (r + 1),  # integers: the mean is float32
            lambda r: torch.full((3,), r + 1.0, dtype=torch.bfloat16),
            lambda r: torch.empty(0, 4, dtype=torch.float64)]
    return 3, [[f(rank) for rank in range(3)] for f in make]


@pytest.mark.points(2)
@settings(max_examples=8)
@given(world_size_and_cases=_mean_example([torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32]))
@example(world_size_and_cases=_dtype_example())
def test_all_reduce_mean_keeps_shape_and_dtype(world_size_and_cases):
    world_size, cases = world_size_and_cases
    _check_means(world_size, cases, run("ex00", _mean_in_rank, cases, world_size=world_size))
