"""Graded tests for exercise 04 (notebooks/04_collectives.ipynb).

The distributed functions run in 2, 3 and 4 gloo ranks. Every reference is computed here, in the
test process, from inputs this file constructs; the learner's module is only ever loaded in the
ranks. While the learner's code runs, the built-in collectives are switched off in the ranks, so an
exercise cannot pass by calling the collective it is meant to build.
"""

import math

import pytest
import torch

from course_lib.grading import exception_raised_by, run

WORLD_SIZES = [2, 3, 4]
TIMEOUT = 30  # s: a ring with a mismatched send/recv hangs; fail it in time

# Shapes chosen so that the length is below, equal to and not a multiple of the world size.
RING_CASES = [((1,), "float32"), ((2,), "float32"), ((5,), "float32"), ((7,), "int64"),
              ((12,), "float32"), ((1001,), "float32"), ((3, 5), "float32"), ((4, 3), "int64")]
GATHER_CASES = [((1,), "float32"), ((6,), "int64"), ((3, 2), "float32")]
BROADCAST_CASES = [(1,), (5,), (4, 3)]

_COLLECTIVES = ["all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single",
                "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all",
                "all_to_all_single", "gather", "scatter", "all_gather_object", "broadcast_object_list",
                "gather_object", "scatter_object_list"]


def make_input(rank: int, shape: tuple, dtype: str, seed: int) -> torch.Tensor:
    """The tensor that `rank` contributes; the test process builds the same ones for its reference."""
    generator = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == "int64":
        return torch.randint(-50, 50, shape, generator=generator)
    return torch.randn(shape, generator=generator)


class _NoBuiltinCollectives:
    """Inside a rank: the built-in collectives raise while the learner's code runs; optionally, sends are counted."""

    def __init__(self, dist, count_sends: bool = False):
        self.dist, self.count_sends, self.saved, self.sends, self.depth = dist, count_sends, [], 0, 0

    def __enter__(self):
        def refuse(name):
            def collective(*args, **kwargs):
                raise RuntimeError(f"dist.{name} is switched off in this exercise: build it from send/recv "
                                   "(isend/irecv, batch_isend_irecv)")
            return collective

        for name in _COLLECTIVES:
            if hasattr(self.dist, name):
                self._replace(self.dist, name, refuse(name))
        if self.count_sends:
            # Both names are replaced: P2POp accepts only the function that distributed_c10d calls isend.
            from torch.distributed import distributed_c10d

            for name in ("send", "isend"):
                original = getattr(self.dist, name)

                def counted(*args, _original=original, **kwargs):
                    self.sends += self.depth == 0  # send() may call isend() itself: count the outer call only
                    self.depth += 1
                    try:
                        return _original(*args, **kwargs)
                    finally:
                        self.depth -= 1

                self._replace(self.dist, name, counted)
                self._replace(distributed_c10d, name, counted)
        return self

    def _replace(self, owner, name, value):
        self.saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def __exit__(self, *exc):
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)
        return False


def _ring_driver(rank, world_size, module, cases, seed):
    import torch.distributed as dist

    out = []
    for shape, dtype in cases:
        tensor = make_input(rank, shape, dtype, seed)
        before = tensor.clone()
        with _NoBuiltinCollectives(dist):
            result = module.ring_all_reduce(tensor)
        out.append({"result": result, "input_unchanged": bool(torch.equal(tensor, before))})
    return out


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ring_all_reduce_matches_the_sum(world_size):
    seed = 4 + world_size
    results = run("ex04", _ring_driver, RING_CASES, seed, world_size=world_size, timeout=TIMEOUT)
    for case, (shape, dtype) in enumerate(RING_CASES):
        inputs = [make_input(rank, shape, dtype, seed) for rank in range(world_size)]
        expected = torch.stack(inputs).sum(dim=0)
        for rank in range(world_size):
            got = results[rank][case]
            assert isinstance(got["result"], torch.Tensor), f"rank {rank}: ring_all_reduce must return a tensor"
            torch.testing.assert_close(got["result"], expected,
                                       msg=lambda m: f"{world_size} ranks, shape {shape} {dtype}, rank {rank}: {m}")
            assert got["input_unchanged"], f"{world_size} ranks, shape {shape}: rank {rank} modified its input"
        first = results[0][case]["result"]
        for rank in range(1, world_size):
            assert torch.equal(results[rank][case]["result"], first), (
                f"{world_size} ranks, shape {shape}: rank {rank} got different values from rank 0 "
                "(every rank must end with the same bits, as after the all-gather phase)")


def _broadcast_driver(rank, world_size, module, shapes, seed):
    import torch.distributed as dist

    out = []
    for src in range(world_size):
        for shape in shapes:
            mine = make_input(rank, shape, "float32", seed)
            tensor = mine.clone() if rank == src else torch.full(shape, float("nan"))
            with _NoBuiltinCollectives(dist, count_sends=True) as counter:
                returned = module.tree_broadcast(tensor, src)
            out.append({"src": src, "tensor": tensor, "returned": returned, "sends": counter.sends})
    return out


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_tree_broadcast_copies_the_source_in_log_rounds(world_size):
    seed = 40 + world_size
    results = run("ex04", _broadcast_driver, BROADCAST_CASES, seed, world_size=world_size, timeout=TIMEOUT)
    rounds = math.ceil(math.log2(world_size))
    for index, got in enumerate(results[0]):
        src, shape = got["src"], BROADCAST_CASES[index % len(BROADCAST_CASES)]
        expected = make_input(src, shape, "float32", seed)
        for rank in range(world_size):
            entry = results[rank][index]
            assert entry["src"] == src
            torch.testing.assert_close(entry["tensor"], expected,
                                       msg=lambda m: f"{world_size} ranks, src {src}, rank {rank}: the tensor "
                                                     f"passed in should hold src's values afterwards: {m}")
            torch.testing.assert_close(entry["returned"], expected,
                                       msg=lambda m: f"{world_size} ranks, src {src}, rank {rank}: returned: {m}")
            assert entry["sends"] <= rounds, (
                f"{world_size} ranks, src {src}: rank {rank} sent {entry['sends']} messages; along a binomial tree "
                f"no rank sends more than ceil(log2({world_size})) = {rounds}")


def _gather_driver(rank, world_size, module, cases, seed):
    import torch.distributed as dist

    out = []
    for shape, dtype in cases:
        tensor = make_input(rank, shape, dtype, seed)
        before = tensor.clone()
        with _NoBuiltinCollectives(dist):
            gathered = module.all_gather_p2p(tensor)
        out.append({"gathered": list(gathered), "input_unchanged": bool(torch.equal(tensor, before))})
    return out


@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_gather_p2p_returns_every_rank_in_order(world_size):
    seed = 400 + world_size
    results = run("ex04", _gather_driver, GATHER_CASES, seed, world_size=world_size, timeout=TIMEOUT)
    for case, (shape, dtype) in enumerate(GATHER_CASES):
        expected = [make_input(r, shape, dtype, seed) for r in range(world_size)]
        for rank in range(world_size):
            got = results[rank][case]
            assert len(got["gathered"]) == world_size, f"rank {rank}: expected a list of {world_size} tensors"
            for source, (tensor, want) in enumerate(zip(got["gathered"], expected)):
                assert torch.equal(tensor, want), (
                    f"{world_size} ranks, shape {shape}: rank {rank}'s entry {source} should be rank {source}'s tensor")
            assert got["input_unchanged"], f"rank {rank} modified its input"


BANDWIDTH_CASES = [
    ("all_reduce", 2**20, 1e-3, 2), ("all_reduce", 2**30, 0.05, 8), ("all_reduce", 4096, 1e-5, 1),
    ("all_gather", 2**26, 0.002, 4), ("reduce_scatter", 3 * 2**20, 1e-3, 3), ("all_to_all", 10**9, 1.0, 16),
    ("broadcast", 2**24, 0.01, 4), ("reduce", 8, 1e-5, 2), ("all_reduce", 0, 1e-5, 4),
]
# Written out here, independently of the exercise: nccl-tests' doc/PERFORMANCE.md.
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
              "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}


def _bandwidth_driver(module, cases):
    return [[float(x) for x in module.bandwidths(*case)] for case in cases]


@pytest.mark.points(2)
def test_bandwidths_follow_nccl_tests():
    got = run("ex04", _bandwidth_driver, BANDWIDTH_CASES, timeout=TIMEOUT)
    for (collective, size, seconds, n), (algbw, busbw) in zip(BANDWIDTH_CASES, got):
        want_alg = size / seconds / 1e9
        assert algbw == pytest.approx(want_alg, rel=1e-9), f"{collective}, {size} B in {seconds} s: algbw in GB/s"
        assert busbw == pytest.approx(want_alg * BUS_FACTOR[collective](n), rel=1e-9), (
            f"{collective} over {n} ranks, {size} B in {seconds} s: busbw in GB/s")


def _bad_bandwidth_inputs(module):
    cases = [("all_reduce", 1024, 0.0, 2), ("all_reduce", 1024, -1.0, 2), ("all_reduce", -1, 1.0, 2),
             ("allreduce", 1024, 1.0, 2), ("all_reduce", 1024, 1.0, 0)]
    return [exception_raised_by(module.bandwidths, *args)[0] for args in cases]


@pytest.mark.points(1)
def test_bandwidths_reject_bad_input():
    assert run("ex04", _bad_bandwidth_inputs, timeout=TIMEOUT) == ["ValueError"] * 5


COST_CASES = [(2**20, 2, 5e-6, 1e-10), (2**30, 8, 1e-5, 1 / 200e9), (1000, 4, 1e-3, 0.0), (2**24, 1, 1e-5, 1e-9),
              (12345, 3, 0.0, 1e-9)]


def _cost_driver(module, cases):
    return [float(module.ring_all_reduce_time(*case)) for case in cases]


@pytest.mark.points(1)
def test_ring_all_reduce_time_alpha_beta():
    got = run("ex04", _cost_driver, COST_CASES, timeout=TIMEOUT)
    for (size, n, alpha, beta), seconds in zip(COST_CASES, got):
        steps = 2 * (n - 1)
        want = steps * alpha + steps * (size / n) * beta
        assert seconds == pytest.approx(want, rel=1e-9, abs=1e-15), f"S={size} B, n={n}, alpha={alpha}, beta={beta}"


def _factor_driver(module, names, world_sizes):
    table = {name: [float(module.bus_bandwidth_factor(name, n)) for n in world_sizes] for name in names}
    bad = [exception_raised_by(module.bus_bandwidth_factor, *args)[0] for args in [("allreduce", 4), ("all_reduce", 0), ("send", 2)]]
    return {"table": table, "bad": bad}


@pytest.mark.points(1)
def test_bus_bandwidth_factor_table():
    world_sizes = [1, 2, 3, 4, 8, 64]
    got = run("ex04", _factor_driver, sorted(BUS_FACTOR), world_sizes, timeout=TIMEOUT)
    for name, factors in got["table"].items():
        for n, factor in zip(world_sizes, factors):
            assert factor == pytest.approx(BUS_FACTOR[name](n), rel=1e-12), f"{name} over {n} ranks"
    assert got["bad"] == ["ValueError"] * 3, "unknown collectives and world_size < 1 must raise ValueError"
