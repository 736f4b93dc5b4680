"""Graded tests for exercise 05 (notebooks/05_ddp.ipynb).

References are computed here, in the test process, with torch's own code on the same data: its bucketing
function (`dist._compute_bucket_assignment_by_size`, called with the parameters in reverse order and the
limits [first bucket, bucket cap], as DDP's reducer calls it when it rebuilds its buckets), its
DistributedSampler, and a single process training on the union of every rank's batch (the answer
DistributedDataParallel promises). The comm hook is compared with torch's fp16_compress_hook in the same
ranks, on the same data.

MiniDDP runs in 1, 2 and 3 gloo ranks, every rank starting from a different random model (so that the
constructor's broadcast matters), on models with a buffer used in forward, a tied weight and a frozen layer,
for several steps. Inside a rank, torch's DistributedDataParallel is switched off while MiniDDP runs, and
every all-reduce is logged where every dist.all_reduce passes (the process group's allreduce method): its
size, dtype and group, whether it was asynchronous, and when it was waited on; markers in the same log say
when backward reached the model's first layer and when it returned. So the tests check the algorithm, not
only the numbers: the first all-reduce starts during backward, nothing waits before backward returns, and
there is one all-reduce per bucket per step, also when the same module is wrapped twice (a notebook cell run
again) and none after close() or a `with` block. train_with_accumulation runs torch's DDP with a counting comm
hook (one all-reduce per optimizer step) and a counting no_sync.

MiniDDP also trains models built from drawn specs (`model_specs`): blocks of distinct sizes that forward visits
in a drawn permutation of their registration order (so gradients become ready in another order than the
buckets', and the all-reduces must still start in bucket order), a layer called twice, a layer whose weight is
tied to the first's, a frozen block, a buffer persistent or not (the broadcast must reach a non-persistent one,
which state_dict() leaves out), a model over 1 MiB (two buckets at DDP's default caps), a loss weighted
differently on each rank, and a block left out of the last step's forward (a trainable parameter without a
gradient: finish_gradient_synchronization() must raise RuntimeError, never skip its bucket); close() right after a
backward must wait for the all-reduces in flight. (Their reference is one process computing each rank's
gradient on that rank's rows and taking the mean: with a 33000-wide layer, one backward over every rank's rows
together rounds differently, and SGD amplifies it past float32's tolerance.) The comm hook is also called by
hand, inside a comm hook of torch's DDP (for a real GradBucket), on the default group, a new group of every
rank and a subgroup of 2 of 3 ranks, beside torch's hook on a copy of the bucket: its future must hold the
float32 mean, and so must the bucket's buffer. sampler_indices must leave the caller's global RNG state as it was.

Generated inputs (Hypothesis): gradient sizes from 0 bytes to GiBs, integral floats among them (a size is a
count: 4096.0 is one, 4096.5 and True are refused), lists empty or of one parameter, caps of 0, fractions of a
MiB and sizes right at a limit (and, fixed, sizes and caps as numpy scalars); dataset lengths from 0, shorter
than the world size, world sizes 1 to 5, every rank, seeds, epochs, drop_last both ways; accumulation windows
that do not divide the number of micro-batches, accumulation_steps as integral floats, and a loss that is not
symmetric in its arguments (mse is: loss_fn(targets, outputs) would pass with it).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from course_lib.grading import exception_raised_by, run
from course_lib.grading.audits import assert_rejects

MiB = 2**20
TIMEOUT = 60  # s: a rank that waits for a bucket that never fills hangs in a collective; fail it in time


def _mb(value) -> str:
    """A bucket size in MiB as the tests write it: 25.0, or 300 / 2**20 for a few hundred bytes."""
    if value and abs(value * MiB - round(value * MiB)) < 1e-6 and value < 1 / 64:
        return f"{round(value * MiB)} / 2**20"
    return repr(value)


def _result_types(value):
    """What a learner's return value is made of, as plain data (type names, nested like the value)."""
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [_result_types(v) for v in value]]
    return type(value).__name__


# ---------------------------------------------------------------- bucket_assignment


def _ddp_buckets(sizes, cap_mb, first_mb):
    """torch's own bucketing of gradients of these sizes, walked in reverse as DDP's reducer walks them.

    Each gradient is a uint8 tensor of that many bytes (an expanded one: no memory), so that
    numel * element_size, what the reducer adds up, is the size given.
    """
    if not sizes:
        return []  # torch asserts on an empty list; DDP refuses a model without trainable parameters
    sizes = [int(size) for size in sizes]  # an integral float such as 4096.0 is a whole number of bytes
    tensors = [torch.empty(1, dtype=torch.uint8).expand(size) if size else torch.empty(0, dtype=torch.uint8)
               for size in sizes]
    order = list(reversed(range(len(sizes))))
    buckets, _ = dist._compute_bucket_assignment_by_size(
        [tensors[i] for i in order], [int(first_mb * MiB), int(cap_mb * MiB)], [False] * len(sizes), order)
    return [list(bucket) for bucket in buckets]


def _refuse(*args, **kwargs):
    raise RuntimeError("bucket_assignment must walk the parameters itself, not call torch's or the course's "
                       "bucketing (torch.distributed._compute_bucket_assignment_by_size, course_lib.parallel.ddp)")


def _bucket_driver(module, cases):
    # The rule is the exercise: torch's own assignment (and the course's model, which calls it) refuse to run here.
    import torch.distributed as dist
    from torch._C import _distributed_c10d

    import course_lib.parallel.ddp as model

    dist._compute_bucket_assignment_by_size = _distributed_c10d._compute_bucket_assignment_by_size = _refuse
    model._bucket_members = model.bucket_sizes = _refuse
    out = []
    for sizes, cap, first, as_tuple in cases:
        given_sizes = tuple(sizes) if as_tuple else list(sizes)
        result = module.bucket_assignment(given_sizes, cap, first)
        out.append({"types": _result_types(result),
                    "buckets": [[int(i) for i in bucket] for bucket in result] if isinstance(result, list) else None,
                    "unchanged": list(given_sizes) == list(sizes)})
    return out


# Sizes around the interesting points: empty gradients, a MiB and either side of it, DDP's 25 MiB, GiBs; and
# integral floats (4096.0 bytes is a whole number: the course's rule for counts).
gradient_sizes = (st.integers(0, 3000)
                  | st.sampled_from([0, 1, 4, MiB - 1, MiB, MiB + 1, 25 * MiB, 3 * 2**30, 300 * MiB])
                  | st.integers(0, 3000).map(float) | st.sampled_from([float(MiB), 4e6, 0.0]))
bucket_caps = (st.sampled_from([0, 0.0, 0.0005, 1000 / MiB, 0.3, 1, 1.0, 25, 25.0])
               | st.floats(0, 30, allow_nan=False, allow_infinity=False))
bucket_cases = st.tuples(st.lists(gradient_sizes, max_size=12), bucket_caps, bucket_caps, st.booleans())

# Always run, before the generated ones: no parameters, one, DDP's defaults on a 4-layer MLP's gradients,
# a cap of 0 (with an empty gradient), a bucket filled EXACTLY to its limit (it closes: >=, not >), a huge
# parameter alone in its bucket, a fractional cap (0.3 MiB is int(314572.8) = 314572 bytes), the bucket
# that would overflow with the next parameter (DDP adds it, then closes), and the first bucket larger than
# the others.
BUCKET_CASES = [
    ([], 25.0, 1.0, False),
    ([4096], 25.0, 1.0, True),
    ([4 * 1024 * 1024, 4096, 4 * 1024 * 256, 1024, 4 * 256 * 10, 40], 25.0, 1.0, False),
    ([512, 0, 64, 256, 16], 0, 0, False),
    ([100, 200, 300, 400, 500, 600], 1000 / MiB, 300 / MiB, False),
    ([64, 3 * 2**30, 64, 64], 1.0, 1.0, True),
    ([314572, 314572, 314573, 1], 0.3, 0.3, False),
    ([10, 990, 20, 980], 1000 / MiB, 1000 / MiB, False),
    ([600, 500, 400, 300, 200, 100], 500 / MiB, 2000 / MiB, False),
    ([1000, 1000, 10**6, 10**6, 48576, 10**6], 1.0, 1.0, False),
    ([5, 1, 999, 600], 1000 / MiB, 600 / MiB, False),   # the SECOND bucket filled exactly: 999 + 1 closes it
    ([4096.0, 4e6, 512, 1048576.0], 25.0, 1.0, False),  # integral floats are sizes (converted with int())
    ([7, 599], 1000 / MiB, 600 / MiB, False),  # the first bucket one byte short of its limit takes the next one too
]


@pytest.mark.points(2)
@settings(max_examples=10)
@given(cases=st.lists(bucket_cases, min_size=1, max_size=10))
@example(cases=BUCKET_CASES)
def test_bucket_assignment_matches_ddp(cases):
    got = run("ex05", _bucket_driver, cases, timeout=TIMEOUT)
    for (sizes, cap, first, as_tuple), result in zip(cases, got):
        where = (f"bucket_assignment({tuple(sizes) if as_tuple else sizes}, bucket_cap_mb={_mb(cap)}, "
                 f"first_bucket_mb={_mb(first)})")
        assert result["types"][0] == "list" and all(t[0] == "list" for t in result["types"][1]), (
            f"{where} must return a list of lists, got {result['types']}")
        assert all(t == "int" for bucket in result["types"][1] for t in bucket[1]), (
            f"{where}: every index must be a Python int, got {result['types']}")
        want = _ddp_buckets(sizes, cap, first)
        assert result["buckets"] == want, (
            f"{where}: DDP's buckets are {want}, got {result['buckets']} (walk from the LAST parameter to the first; "
            f"close a bucket as soon as it holds AT LEAST its limit, int(mb * 2**20) bytes; the first bucket's "
            f"limit is first_bucket_mb, the others' bucket_cap_mb)")
        assert result["unchanged"], f"{where} changed its argument sizes_in_bytes: leave it as it was"


def _bad_bucket_driver(module, cases):
    return [exception_raised_by(module.bucket_assignment, sizes, cap, first) for sizes, cap, first in cases]


@st.composite
def bad_bucket_cases(draw):
    """A valid call with one argument made invalid, and the argument's name."""
    sizes = draw(st.lists(st.integers(0, 5000), min_size=1, max_size=6))
    cap, first = draw(bucket_caps), draw(bucket_caps)
    broken = draw(st.sampled_from(["sizes_in_bytes", "bucket_cap_mb", "first_bucket_mb"]))
    if broken == "sizes_in_bytes":  # negative, fractional, not finite, a bool, not a number at all
        sizes[draw(st.integers(0, len(sizes) - 1))] = draw(
            st.integers(-10**9, -1) | st.floats(-1e6, 1e6).filter(lambda v: not v.is_integer())
            | st.sampled_from([4096.5, 0.5, -4096.0, float("nan"), float("inf"), True, False, "4096", None]))
    elif broken == "bucket_cap_mb":
        cap = draw(st.floats(-100, -1e-9) | st.sampled_from([-1, float("nan")]))
    else:
        first = draw(st.floats(-100, -1e-9) | st.sampled_from([-1, float("nan")]))
    return (sizes, cap, first), broken


BAD_BUCKET_CASES = [(([100, -1, 50], 25.0, 1.0), "sizes_in_bytes"), (([100], -1.0, 1.0), "bucket_cap_mb"),
                    (([100], 25.0, -0.5), "first_bucket_mb"), (([-5], 0, 0), "sizes_in_bytes"),
                    (([100, 200], float("nan"), 1.0), "bucket_cap_mb"), (([0], 0.0, -1e-9), "first_bucket_mb"),
                    (([100, True, 50], 25.0, 1.0), "sizes_in_bytes"),   # a bool is an int, not a size
                    (([4096.5], 25.0, 1.0), "sizes_in_bytes"), (([100, 2.5e-1], 0, 0), "sizes_in_bytes"),
                    (([float("inf")], 25.0, 1.0), "sizes_in_bytes")]   # a fraction of a byte is not a size


@pytest.mark.points(1)
@settings(max_examples=4)
@given(cases=st.lists(bad_bucket_cases(), min_size=1, max_size=6))
@example(cases=BAD_BUCKET_CASES)
def test_bucket_assignment_rejects_bad_input(cases):
    got = run("ex05", _bad_bucket_driver, [call for call, _ in cases], timeout=TIMEOUT)
    for ((sizes, cap, first), broken), (raised, message) in zip(cases, got):
        where = f"bucket_assignment({sizes}, bucket_cap_mb={cap}, first_bucket_mb={first})"
        assert_rejects(where, raised, message, broken)


def _numpy_bucket_driver(module, cases):
    # numpy's scalars are made here, in the child, from (dtype name, value) pairs: plain data crosses over
    import numpy as np

    def scalar(pair):
        return np.dtype(pair[0]).type(pair[1])

    out = []
    for sizes, cap, first in cases:
        result = module.bucket_assignment([scalar(s) for s in sizes], scalar(cap), scalar(first))
        out.append({"types": _result_types(result),
                    "buckets": [[int(i) for i in bucket] for bucket in result] if isinstance(result, list) else None})
    return out


# Sizes as numpy computes them (np.prod(shape) * 4 is a numpy.int64) and in narrow dtypes: two numpy.uint16
# sizes of 60000 add up to 120000 as Python ints, to 54464 if the running total stays a numpy.uint16.
NUMPY_BUCKET_CASES = [
    ([("int64", 4 * 64 * 32), ("int64", 4 * 64), ("int64", 4 * 10 * 64), ("int64", 40)], ("float64", 25.0),
     ("float64", 1.0)),
    ([("uint16", 60000)] * 4, ("float64", 100_000 / MiB), ("int64", 0)),
    ([("int32", 300), ("uint8", 200), ("int16", 700), ("intp", 1000)], ("int64", 0), ("float64", 1000 / MiB)),
    ([("float64", 300.0), ("float32", 700.0), ("int64", 1000)], ("float32", 0.0), ("float64", 1000 / MiB)),
]


@pytest.mark.points(1)
def test_bucket_assignment_accepts_numpy_integers():
    got = run("ex05", _numpy_bucket_driver, NUMPY_BUCKET_CASES, timeout=TIMEOUT)
    for (sizes, cap, first), result in zip(NUMPY_BUCKET_CASES, got):
        where = (f"bucket_assignment([{', '.join(f'np.{d}({v})' for d, v in sizes)}], bucket_cap_mb=np.{cap[0]}"
                 f"({_mb(cap[1])}), first_bucket_mb=np.{first[0]}({_mb(first[1])}))")
        assert result["types"][0] == "list" and all(t[0] == "list" for t in result["types"][1]), (
            f"{where} must return a list of lists, got {result['types']}")
        assert all(t == "int" for bucket in result["types"][1] for t in bucket[1]), (
            f"{where}: every index must be a Python int, got {result['types']}")
        want = _ddp_buckets([v for _, v in sizes], cap[1], first[1])
        assert result["buckets"] == want, (
            f"{where}: numpy's integers are whole numbers (numbers.Integral, operator.index), and sizes add up as "
            f"Python ints (a numpy.uint16 total wraps around at 65536): DDP's buckets are {want}, got "
            f"{result['buckets']}")


# ---------------------------------------------------------------- MiniDDP: the ranks' side


class _LoggedWork:
    """What dist.all_reduce(..., async_op=True) returned, noting when it is waited on."""

    def __init__(self, log, work, rid):
        self._log, self._work, self._rid = log, work, rid

    def wait(self, *args, **kwargs):
        self._log.events.append(["wait", self._rid])
        return self._work.wait(*args, **kwargs)

    def get_future(self, *args, **kwargs):
        self._log.events.append(["future", self._rid])  # whoever takes the future waits on it, later or now
        return self._work.get_future(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


class _AllReduceLog:
    """Inside a rank: log every all-reduce where every dist.all_reduce passes, the process group's allreduce.

    Events in program order, each one of
      ["all_reduce", id, elements, dtype, asynchronous, group name]
      ["wait", id] or ["future", id]
      ["mark", what]      (the test driver's own markers: "step 0", "backward reached the first layer", ...)
    While `active` is False nothing is logged (the comm hook test compares with torch's hook in the same rank).
    """

    def __init__(self):
        self.events, self.active, self._saved = [], True, None

    def mark(self, what):
        self.events.append(["mark", what])

    def __enter__(self):
        from torch._C._distributed_c10d import ProcessGroup

        original = ProcessGroup.allreduce
        log = self

        def allreduce(group, tensors, *args, **kwargs):
            if not log.active:
                return original(group, tensors, *args, **kwargs)
            listed = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
            options = args[0] if args else kwargs.get("opts")
            asynchronous = getattr(options, "asyncOp", None)
            rid = sum(1 for event in log.events if event[0] == "all_reduce")
            dtype = str(listed[0].dtype) if listed else ""
            log.events.append(["all_reduce", rid, sum(t.numel() for t in listed), dtype,
                               None if asynchronous is None else bool(asynchronous), group.group_name])
            return _LoggedWork(log, original(group, tensors, *args, **kwargs), rid)

        self._saved = (ProcessGroup, original)
        ProcessGroup.allreduce = allreduce
        return self

    def __exit__(self, *exc):
        owner, original = self._saved
        owner.allreduce = original
        return False


def _switch_off_torch_ddp():
    """MiniDDP must be built from broadcast, hooks and all_reduce, not be torch's DDP in disguise."""
    from torch.nn.parallel import DistributedDataParallel

    def refused(self, *args, **kwargs):
        raise RuntimeError("torch's DistributedDataParallel is switched off while MiniDDP is tested: build MiniDDP "
                           "from dist.broadcast, post-accumulate-grad hooks and dist.all_reduce(async_op=True)")

    DistributedDataParallel.__init__ = refused


class TiedFrozen(nn.Module):
    """A buffer used in forward, a weight used by two layers (one Parameter), and a frozen layer."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.again = nn.Linear(8, 8)
        self.again.weight = self.first.weight  # tied: model.parameters() lists it once
        self.frozen = nn.Linear(8, 16)
        self.frozen.requires_grad_(False)
        self.last = nn.Linear(16, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        h = torch.tanh(self.first(x))
        h = torch.tanh(self.again(h))
        h = torch.tanh(self.frozen(h))
        return self.last(h) * self.scale


def make_model(kind: str, seed: int) -> nn.Module:
    """The models the MiniDDP tests train: the same seed gives the same model here and in every rank."""
    torch.manual_seed(seed)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    if kind == "mlp3":
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    model = TiedFrozen()
    with torch.no_grad():
        model.scale.copy_(torch.rand(4) + 0.5)
    return model


def _global_batch(seed: int, step: int, world_size: int, rows: int):
    """Step `step`'s batch of all ranks together: rank r's share is rows r*rows .. (r+1)*rows - 1."""
    generator = torch.Generator().manual_seed(1000 * seed + step)
    return (torch.randn(world_size * rows, 8, generator=generator),
            torch.randn(world_size * rows, 4, generator=generator))


def _trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def _reference_buckets(kind: str, cap: float) -> list[int]:
    """Elements per bucket, sorted, as torch buckets the trainable gradients (first bucket: min(1, cap) MiB)."""
    params = _trainable(make_model(kind, 0))
    sizes = [p.numel() * p.element_size() for p in params]
    return sorted(sum(params[i].numel() for i in bucket) for bucket in _ddp_buckets(sizes, cap, min(1.0, cap)))


# ---------------------------------------------------------------- MiniDDP: results


def _train_driver(rank, world_size, module, cases):
    _switch_off_torch_ddp()
    out = []
    for case in cases:
        model = make_model(case["model"], case["seed"] + rank)  # a different model in every rank until broadcast
        wrapped = module.MiniDDP(model, bucket_cap_mb=case["cap"])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
        same_forward = []
        for step in range(case["steps"]):
            x, y = _global_batch(case["seed"], step, world_size, case["rows"])
            mine = slice(rank * case["rows"], (rank + 1) * case["rows"])
            optimizer.zero_grad()
            output = wrapped(x[mine])
            with torch.no_grad():
                same_forward.append(bool(torch.equal(output, model(x[mine]))))
            F.mse_loss(output, y[mine]).backward()
            wrapped.finish_gradient_synchronization()
            grads = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
            optimizer.step()
        out.append({"is_module": isinstance(wrapped, nn.Module), "same_object": wrapped.module is model,
                    "same_forward": same_forward, "grads": grads,
                    "params": [p.detach().clone() for p in model.parameters()],
                    "buffers": [b.detach().clone() for b in model.buffers()]})
    return out


def _single_process(case, world_size):
    """One process on the whole batch of every step, from rank 0's model: what DDP must reproduce."""
    model = make_model(case["model"], case["seed"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    for step in range(case["steps"]):
        x, y = _global_batch(case["seed"], step, world_size, case["rows"])
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        grads = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
        optimizer.step()
    return model, grads


mini_cases = st.fixed_dictionaries({
    "model": st.sampled_from(["mlp", "mlp3", "tied"]),
    "cap": st.sampled_from([0.0, 300 / MiB, 1000 / MiB, 25.0]),
    "steps": st.integers(1, 3), "rows": st.integers(1, 3), "seed": st.integers(0, 1000)})
MINI_CASES = [{"model": "tied", "cap": 0.0, "steps": 3, "rows": 2, "seed": 1},
              {"model": "mlp3", "cap": 1000 / MiB, "steps": 3, "rows": 1, "seed": 2},
              {"model": "tied", "cap": 25.0, "steps": 2, "rows": 3, "seed": 3}]


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [1, 2, 3])
@settings(max_examples=2)
@given(cases=st.lists(mini_cases, min_size=1, max_size=3))
@example(cases=MINI_CASES)
def test_mini_ddp_matches_a_single_process_on_the_whole_batch(world_size, cases):
    got = run("ex05", _train_driver, cases, world_size=world_size, timeout=TIMEOUT)
    for index, case in enumerate(cases):
        reference, reference_grads = _single_process(case, world_size)
        names = [name for name, _ in reference.named_parameters()]
        for rank in range(world_size):
            result = got[rank][index]
            where = f"rank {rank} of {world_size}, model {case['model']!r}, bucket_cap_mb={_mb(case['cap'])}"
            assert result["is_module"], f"{where}: MiniDDP must be an nn.Module"
            assert result["same_object"], f"{where}: MiniDDP(module).module must be the very module it was given"
            assert all(result["same_forward"]), f"{where}: MiniDDP's forward must return what module(...) returns"
            for name, grad, want in zip(names, result["grads"], reference_grads):
                if want is None:
                    assert grad is None, f"{where}: {name} is frozen: it must keep no gradient"
                    continue
                assert grad is not None, f"{where}: {name} has no gradient after finish_gradient_synchronization()"
                torch.testing.assert_close(grad, want, msg=lambda m: (
                    f"{where}, step {case['steps'] - 1}: {name}.grad must be the MEAN of the ranks' gradients "
                    f"(what one process gets on the whole batch)\n{m}"))
            for name, param, want in zip(names, result["params"], reference.parameters()):
                torch.testing.assert_close(param, want.detach(), msg=lambda m: (
                    f"{where}: after {case['steps']} steps {name} differs from one process on the whole batch "
                    f"(every rank starts from rank 0's model, and averages its gradients every step)\n{m}"))
            for buffer, want in zip(result["buffers"], reference.buffers()):
                torch.testing.assert_close(buffer, want, msg=f"{where}: the buffers must be rank 0's")


def _broadcast_driver(rank, world_size, module, kinds):
    _switch_off_torch_ddp()
    out = []
    for kind in kinds:
        model = make_model(kind, 50 + rank)
        module.MiniDDP(model, bucket_cap_mb=25.0)
        out.append({name: value.detach().clone() for name, value in model.state_dict().items()})
    return out


@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [3])
def test_mini_ddp_broadcasts_parameters_and_buffers_from_rank_0(world_size):
    kinds = ["tied", "mlp"]
    got = run("ex05", _broadcast_driver, kinds, world_size=world_size, timeout=TIMEOUT)
    for index, kind in enumerate(kinds):
        want = make_model(kind, 50).state_dict()  # rank 0's model
        for rank in range(world_size):
            for name, value in want.items():
                what = "buffer" if name.endswith("scale") else "parameter"
                assert torch.equal(got[rank][index][name], value), (
                    f"rank {rank} of {world_size}, model {kind!r}: after MiniDDP(...) the {what} {name} must be "
                    f"rank 0's (dist.broadcast every parameter, frozen ones too, and every buffer from rank 0)")


# ---------------------------------------------------------------- MiniDDP: the algorithm


def _first_layer_marker(model, log):
    """When backward reaches the first layer's output, say so in the log (a hook on that tensor)."""
    first = next(m for m in model.modules() if isinstance(m, nn.Linear))

    def on_forward(_module, _inputs, output):
        if output.requires_grad:
            output.register_hook(lambda grad: log.mark("backward reached the first layer"))

    first.register_forward_hook(on_forward)


def _logged_driver(rank, world_size, module, cases, steps):
    _switch_off_torch_ddp()
    out = []
    for kind, cap in cases:
        model = make_model(kind, 7)
        with _AllReduceLog() as log:
            _first_layer_marker(model, log)
            wrapped = module.MiniDDP(model, bucket_cap_mb=cap)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
            for step in range(steps):
                x, y = _global_batch(7, step, world_size, 2)
                log.mark(f"step {step}")
                optimizer.zero_grad()
                F.mse_loss(wrapped(x[2 * rank:2 * rank + 2]), y[2 * rank:2 * rank + 2]).backward()
                log.mark("backward returned")
                wrapped.finish_gradient_synchronization()
                log.mark("finish returned")
                optimizer.step()
        out.append(log.events)
    return out


def _steps_of(events):
    """The log cut at the "step k" markers: one list of events per step."""
    steps = []
    for event in events:
        if event[0] == "mark" and event[1].startswith("step "):
            steps.append([])
        elif steps:
            steps[-1].append(event)
    return steps


def _position(events, what):
    return next((i for i, event in enumerate(events) if event == ["mark", what]), None)


OVERLAP_CASES = [("mlp3", 0.0), ("mlp3", 600 / MiB), ("tied", 0.0)]


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2])
def test_mini_ddp_overlaps_all_reduces_with_backward(world_size):
    got = run("ex05", _logged_driver, OVERLAP_CASES, 2, world_size=world_size, timeout=TIMEOUT)
    for rank in range(world_size):
        for (kind, cap), events in zip(OVERLAP_CASES, got[rank]):
            for step, part in enumerate(_steps_of(events)):
                where = f"rank {rank}, model {kind!r}, bucket_cap_mb={_mb(cap)}, step {step}"
                reduces = [e for e in part if e[0] == "all_reduce"]
                assert reduces, f"{where}: no all-reduce at all"
                reached = _position(part, "backward reached the first layer")
                returned, finished = _position(part, "backward returned"), _position(part, "finish returned")
                first = part.index(reduces[0])
                assert first < reached, (
                    f"{where}: the first all-reduce started only after backward reached the model's first layer: start "
                    "each bucket's all-reduce from the hook, as soon as the bucket is full, so it travels while "
                    "backward computes the earlier layers' gradients")
                assert all(e[4] is True for e in reduces), (
                    f"{where}: every all-reduce must be asynchronous, dist.all_reduce(buffer, async_op=True), so the "
                    f"hook returns at once; got async flags {[e[4] for e in reduces]}")
                early = [e for e in part[:returned] if e[0] == "wait"]
                assert not early, (
                    f"{where}: an all-reduce was waited on before backward returned: wait only in "
                    "finish_gradient_synchronization(), once backward is done")
                ids = {e[1] for e in reduces}
                waited = {e[1] for e in part[:finished] if e[0] in ("wait", "future")}
                assert ids <= waited, (
                    f"{where}: finish_gradient_synchronization() returned before waiting on every all-reduce "
                    f"(never waited on: {sorted(ids - waited)})")


COUNT_CASES = [("mlp3", 0.0), ("mlp3", 300 / MiB), ("mlp3", 1500 / MiB), ("mlp3", 25.0), ("tied", 0.0),
               ("tied", 400 / MiB), ("mlp", 25.0)]


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [3])
def test_mini_ddp_all_reduces_once_per_bucket_every_step(world_size):
    steps = 3
    got = run("ex05", _logged_driver, COUNT_CASES, steps, world_size=world_size, timeout=TIMEOUT)
    for rank in range(world_size):
        for (kind, cap), events in zip(COUNT_CASES, got[rank]):
            want = _reference_buckets(kind, cap)
            trainable = len(_trainable(make_model(kind, 0)))
            if cap == 0:
                assert len(want) == trainable
            parts = _steps_of(events)
            assert len(parts) == steps
            for step, part in enumerate(parts):
                where = f"rank {rank} of {world_size}, model {kind!r}, bucket_cap_mb={_mb(cap)}, step {step}"
                reduces = [e for e in part if e[0] == "all_reduce"]
                assert len(reduces) == len(want), (
                    f"{where}: {len(want)} bucket(s) of {want} elements ({trainable} trainable parameters: frozen ones "
                    f"and a second use of a tied weight do not count), so {len(want)} all-reduce(s) per step, got "
                    f"{len(reduces)}" + (" (bucket_cap_mb=0: one bucket per parameter)" if cap == 0 else ""))
                assert sorted(e[2] for e in reduces) == want, (
                    f"{where}: the buckets hold {want} elements (bucket_assignment over the trainable parameters), "
                    f"the all-reduces carried {sorted(e[2] for e in reduces)}")
                assert all(e[3] == "torch.float32" for e in reduces), f"{where}: all-reduce the gradients' own dtype"


def _rewrap_driver(rank, world_size, module, case):
    _switch_off_torch_ddp()
    rows, cap = case["rows"], case["cap"]
    mine = slice(rank * rows, (rank + 1) * rows)
    model = make_model(case["model"], case["seed"] + rank)
    with _AllReduceLog() as log:
        first = module.MiniDDP(model, bucket_cap_mb=cap)  # a notebook cell run once...  # noqa: F841 (kept alive)
        wrapped = module.MiniDDP(model, bucket_cap_mb=cap)  # ...and run again, on the same module
        optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
        for step in range(case["steps"]):
            x, y = _global_batch(case["seed"], step, world_size, rows)
            log.mark(f"step {step}")
            optimizer.zero_grad()
            F.mse_loss(wrapped(x[mine]), y[mine]).backward()
            wrapped.finish_gradient_synchronization()
            optimizer.step()
        params = [p.detach().clone() for p in model.parameters()]
        wrapped.close()
        wrapped.close()  # twice: harmless
        log.mark("step after close()")
        model.zero_grad()
        F.mse_loss(model(x[mine]), y[mine]).backward()
        other = make_model(case["model"], case["seed"])
        log.mark("step inside a with block")
        with module.MiniDDP(other, bucket_cap_mb=cap) as entered:
            is_self = isinstance(entered, module.MiniDDP) and entered.module is other
            F.mse_loss(entered(x[mine]), y[mine]).backward()
            entered.finish_gradient_synchronization()
        log.mark("step after the with block")
        other.zero_grad()
        F.mse_loss(other(x[mine]), y[mine]).backward()
    return {"events": log.events, "params": params, "is_self": is_self}


REWRAP_CASES = [{"model": "mlp3", "cap": 300 / MiB, "steps": 2, "rows": 2, "seed": 11},
                {"model": "tied", "cap": 0.0, "steps": 2, "rows": 1, "seed": 12}]


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2])
@pytest.mark.parametrize("case", REWRAP_CASES, ids=lambda case: f"{case['model']}-{round(case['cap'] * MiB)}B")
def test_mini_ddp_rewrapped_or_closed_hooks_once(world_size, case):
    got = run("ex05", _rewrap_driver, case, world_size=world_size, timeout=TIMEOUT)
    want = _reference_buckets(case["model"], case["cap"])
    reference, _ = _single_process(case, world_size)
    names = [name for name, _ in reference.named_parameters()]
    for rank in range(world_size):
        result = got[rank]
        where = f"rank {rank} of {world_size}, model {case['model']!r}, bucket_cap_mb={_mb(case['cap'])}"
        parts = _steps_of(result["events"])
        assert len(parts) == case["steps"] + 3
        for step, part in enumerate(parts[:case["steps"]]):
            reduces = [e for e in part if e[0] == "all_reduce"]
            assert len(reduces) == len(want), (
                f"{where}, step {step}: the module was wrapped twice (a cell run again), so only the second "
                f"MiniDDP's hooks may fire: {len(want)} all-reduce(s) per step, one per bucket, got {len(reduces)} "
                "(the constructor must close the MiniDDP that wrapped this module before: remove its hooks)")
        for name, param, expected in zip(names, result["params"], reference.parameters()):
            torch.testing.assert_close(param, expected.detach(), msg=lambda m: (
                f"{where}: after wrapping twice and {case['steps']} steps, {name} differs from one process on the "
                f"whole batch\n{m}"))
        after_close, inside, after_with = parts[case["steps"]:]
        assert not [e for e in after_close if e[0] == "all_reduce"], (
            f"{where}: a backward after close() started an all-reduce: close() must remove every hook it registered "
            "(keep the handles register_post_accumulate_grad_hook returns and call .remove())")
        assert result["is_self"], f"{where}: `with MiniDDP(module) as model:` must give the wrapper itself"
        assert len([e for e in inside if e[0] == "all_reduce"]) == len(want), (
            f"{where}: inside `with MiniDDP(...) as model:` a step all-reduces once per bucket ({len(want)})")
        assert not [e for e in after_with if e[0] == "all_reduce"], (
            f"{where}: after the `with` block ends the wrapper is closed: a backward must start no all-reduce")


# ---------------------------------------------------------------- MiniDDP: generated models


class _Block(nn.Module):
    """A residual bottleneck h + up(tanh(down(h))) of `width`: its width sets its parameters' sizes."""

    def __init__(self, width):
        super().__init__()
        self.down = nn.Linear(8, width, bias=False)
        self.up = nn.Linear(width, 8)

    def forward(self, h):
        return h + self.up(torch.tanh(self.down(h)))


class SpecModel(nn.Module):
    """A model built from a drawn spec (`model_specs`): first layer, blocks, an optional tied layer, a head.

    Forward visits the blocks in spec["sequence"], a permutation of the registration order (so gradients become
    ready in another order than the buckets'), where a block may appear twice (one layer called twice) and
    "again" is a layer whose weight is `first`'s (tied). `skip`, set by the driver, leaves a block out of one
    forward (its trainable parameters get no gradient). A buffer used in forward, persistent or not; one
    block may be frozen.
    """

    def __init__(self, spec):
        super().__init__()
        self.sequence = list(spec["sequence"])
        self.skip = None
        self.first = nn.Linear(8, 8)
        self.blocks = nn.ModuleList(_Block(width) for width in spec["widths"])
        if "again" in self.sequence:
            self.again = nn.Linear(8, 8)
            self.again.weight = self.first.weight  # tied: model.parameters() lists it once
        self.head = nn.Linear(8, 4)
        self.register_buffer("scale", torch.rand(4) + 0.5, persistent=spec["persistent"])
        if spec["frozen"] is not None:
            self.blocks[spec["frozen"]].requires_grad_(False)

    def forward(self, x):
        h = torch.tanh(self.first(x))
        for item in self.sequence:
            if item == self.skip:
                continue
            h = torch.tanh(self.again(h)) if item == "again" else self.blocks[item](h)
        return self.head(h) * self.scale


def _spec_model(spec, seed):
    torch.manual_seed(seed)
    return SpecModel(spec)


def _spec_loss(kind, output, target, rank):
    """The loss of one rank's rows. "weighted" is not symmetric across ranks: rank r weighs its mean squared
    error by r + 1, so the ranks' gradients differ in scale, not only in data."""
    loss = F.mse_loss(output, target)
    return loss if kind == "mse" else loss * (rank + 1)


BIG = 33_000  # a block this wide holds two weights of 8 * 33000 * 4 bytes, each over 1 MiB: two buckets at 25 MiB


@st.composite
def model_specs(draw):
    """A model (layer order, tied / twice-used / frozen / skipped layers, buffer persistence, size), a bucket
    cap, a loss, and the steps: the shapes of training that make DDP's bucket order and error cases matter."""
    widths = draw(st.lists(st.integers(1, 7), min_size=2, max_size=4, unique=True))  # distinct sizes per block
    if draw(st.booleans()):
        widths[draw(st.integers(0, len(widths) - 1))] = BIG
    items = list(range(len(widths))) + (["again"] if draw(st.booleans()) else [])
    sequence = list(draw(st.permutations(items)))
    twice = draw(st.none() | st.integers(0, len(widths) - 1))
    if twice is not None:
        sequence.insert(draw(st.integers(0, len(sequence))), twice)
    return {"widths": widths, "sequence": sequence,
            "frozen": draw(st.none() | st.integers(0, len(widths) - 1)),
            "skip": draw(st.none() | st.integers(0, len(widths) - 1)),  # left out of the last step's forward
            "persistent": draw(st.booleans()),
            "cap": draw(st.sampled_from([0.0, 200 / MiB, 1000 / MiB, 25.0])),
            "loss": draw(st.sampled_from(["mse", "weighted"])),
            "steps": draw(st.integers(1, 3)), "rows": draw(st.integers(1, 3)), "seed": draw(st.integers(0, 1000))}


def _spec_driver(rank, world_size, module, specs):
    _switch_off_torch_ddp()
    out = []
    with _AllReduceLog() as log:
        for spec in specs:
            model = _spec_model(spec, spec["seed"] + rank)  # a different model in every rank until broadcast
            wrapped = module.MiniDDP(model, bucket_cap_mb=spec["cap"])
            start = {"params": [p.detach().clone() for p in model.parameters()],
                     "buffers": {name: b.detach().clone() for name, b in model.named_buffers()}}
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            mine = slice(rank * spec["rows"], (rank + 1) * spec["rows"])
            grads, raised, raised_at = [], None, None
            del log.events[:]
            for step in range(spec["steps"]):
                x, y = _global_batch(spec["seed"], step, world_size, spec["rows"])
                model.skip = spec["skip"] if step == spec["steps"] - 1 else None
                log.mark(f"step {step}")
                optimizer.zero_grad()
                _spec_loss(spec["loss"], wrapped(x[mine]), y[mine], rank).backward()
                raised = exception_raised_by(wrapped.finish_gradient_synchronization)
                log.mark("finish returned")
                if raised[0] != "returned":
                    raised_at = step
                    break
                grads.append([None if p.grad is None else p.grad.detach().clone() for p in model.parameters()])
                optimizer.step()
            params = [p.detach().clone() for p in model.parameters()]
            # One more backward, then close() with its all-reduces still in flight: close() must wait for them.
            model.skip = None
            log.mark("step closed in flight")
            _spec_loss(spec["loss"], wrapped(x[mine]), y[mine], rank).backward()
            wrapped.close()
            log.mark("close returned")
            out.append({"start": start, "grads": grads, "params": params, "raised": raised, "raised_at": raised_at,
                        "events": list(log.events)})
    return out


def _spec_reference(spec, world_size):
    """One process from rank 0's model: each step, each rank's gradient on its rows (its own backward, the same
    shapes as in the rank), their mean, one SGD step; the gradients of each step it completes, its parameters,
    the elements of each bucket in bucket order, and whether the last step must fail (and which buckets start)."""
    model = _spec_model(spec, spec["seed"])
    trainable = _trainable(model)
    skipped = [] if spec["skip"] is None else [p for p in model.blocks[spec["skip"]].parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    grads, fails = [], False
    for step in range(spec["steps"]):
        x, y = _global_batch(spec["seed"], step, world_size, spec["rows"])
        model.skip = spec["skip"] if step == spec["steps"] - 1 else None
        if model.skip is not None and skipped:
            fails = True  # a trainable parameter gets no gradient: MiniDDP must raise, not step
            break
        rows, mean = spec["rows"], None
        for r in range(world_size):
            model.zero_grad()
            mine = slice(r * rows, (r + 1) * rows)
            _spec_loss(spec["loss"], model(x[mine]), y[mine], r).backward()
            shares = [None if p.grad is None else p.grad / world_size for p in model.parameters()]
            mean = shares if mean is None else [None if a is None else a + b for a, b in zip(mean, shares)]
        for p, grad in zip(model.parameters(), mean):
            p.grad = grad
        grads.append([None if grad is None else grad.clone() for grad in mean])
        optimizer.step()
    sizes = [p.numel() * p.element_size() for p in trainable]
    buckets = _ddp_buckets(sizes, spec["cap"], min(1.0, spec["cap"]))
    elements = [sum(trainable[i].numel() for i in bucket) for bucket in buckets]
    # The buckets that start in the failing step: those before the first one holding a parameter left out.
    missing = {id(p) for p in skipped}
    first_blocked = next((b for b, bucket in enumerate(buckets) if any(id(trainable[i]) in missing for i in bucket)),
                         len(buckets))
    return {"model": model, "grads": grads, "fails": fails, "elements": elements,
            "started_when_failing": elements[:first_blocked]}


def _spec_where(spec, rank, world_size):
    widths = ", ".join(str(w) for w in spec["widths"])
    return (f"rank {rank} of {world_size}, blocks of widths [{widths}] registered in that order, forward visits "
            f"{spec['sequence']} ('again' shares first's weight), frozen block {spec['frozen']}, "
            f"{'persistent' if spec['persistent'] else 'non-persistent'} buffer, loss {spec['loss']!r}, "
            f"bucket_cap_mb={_mb(spec['cap'])}")


# Always run: a model over 1 MiB (two buckets at DDP's default caps) visited out of order with a tied layer,
# a non-persistent buffer and an asymmetric loss; one bucket per parameter, blocks visited in reverse, one of
# them twice; a block left out of the last step (it must fail there); a frozen block left out (it must not).
SPEC_CASES = [
    {"widths": [3, BIG, 5], "sequence": [1, "again", 2, 0], "frozen": None, "skip": None, "persistent": False,
     "cap": 25.0, "loss": "weighted", "steps": 2, "rows": 2, "seed": 21},
    {"widths": [2, 6, 4], "sequence": [2, 1, 0, 1], "frozen": None, "skip": 0, "persistent": True,
     "cap": 0.0, "loss": "mse", "steps": 3, "rows": 1, "seed": 22},
    {"widths": [5, 1, 7], "sequence": [0, 2, "again", 1], "frozen": 1, "skip": 1, "persistent": False,
     "cap": 200 / MiB, "loss": "weighted", "steps": 2, "rows": 3, "seed": 23},
]


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 3])
@settings(max_examples=2)
@given(specs=st.lists(model_specs(), min_size=1, max_size=3))
@example(specs=SPEC_CASES)
def test_mini_ddp_on_generated_models_in_bucket_order(world_size, specs):
    got = run("ex05", _spec_driver, specs, world_size=world_size, timeout=TIMEOUT)
    for index, spec in enumerate(specs):
        ref = _spec_reference(spec, world_size)
        rank0 = _spec_model(spec, spec["seed"])
        names = [name for name, _ in ref["model"].named_parameters()]
        for rank in range(world_size):
            result, where = got[rank][index], _spec_where(spec, rank, world_size)
            for name, param, want in zip(names, result["start"]["params"], rank0.parameters()):
                assert torch.equal(param, want), f"{where}: after MiniDDP(...) {name} must be rank 0's (broadcast)"
            for name, want in rank0.named_buffers():
                assert torch.equal(result["start"]["buffers"][name], want), (
                    f"{where}: after MiniDDP(...) the buffer {name} must be rank 0's: broadcast every tensor of "
                    "module.buffers(), a non-persistent one too (state_dict() leaves those out)")
            if ref["fails"]:
                assert result["raised"][0] == "RuntimeError", (
                    f"{where}: the last step leaves block {spec['skip']} out of forward, so its parameters get no "
                    "gradient and their bucket never starts: finish_gradient_synchronization() must raise "
                    f"RuntimeError (never skip the bucket: each rank would step on its own gradients), got "
                    f"{result['raised'][0]} {result['raised'][1]}")
                assert result["raised_at"] == spec["steps"] - 1, (
                    f"{where}: finish_gradient_synchronization() raised at step {result['raised_at']}, but only the "
                    f"last step, {spec['steps'] - 1}, leaves a parameter without a gradient")
            else:
                assert result["raised"][0] == "returned", (
                    f"{where}: finish_gradient_synchronization() raised {result['raised'][0]}: "
                    f"{result['raised'][1]}" + (" (the block left out is frozen: every trainable parameter got "
                                                "its gradient)" if spec["skip"] is not None else ""))
            parts = _steps_of(result["events"])
            for step, part in enumerate(parts[:spec["steps"]]):
                sizes = [e[2] for e in part if e[0] == "all_reduce"]
                failing = ref["fails"] and step == spec["steps"] - 1
                want = ref["started_when_failing"] if failing else ref["elements"]
                assert sizes == want, (
                    f"{where}, step {step}: the buckets hold {ref['elements']} elements, in bucket order (bucket 0 "
                    f"first); the all-reduces carried {sizes}, in the order they started. Start the buckets in "
                    "bucket order: forward visits the layers in another order than they were registered, so a "
                    "bucket can fill before an earlier one; it waits until every earlier bucket has started"
                    + (f" (this step leaves block {spec['skip']} out: only the buckets before its first one "
                       "can start)" if failing else ""))
            # Not bitwise: the all-reduce may add the ranks' shares in another order than the reference's
            # rank order, so float32's default tolerance (rtol 1.3e-6, atol 1e-5).
            assert len(result["grads"]) == len(ref["grads"]), (
                f"{where}: {len(ref['grads'])} step(s) must finish, {len(result['grads'])} did")
            for step, (mine, theirs) in enumerate(zip(result["grads"], ref["grads"])):
                for name, grad, want in zip(names, mine, theirs):
                    if want is None:
                        assert grad is None, f"{where}, step {step}: {name} is frozen: it must keep no gradient"
                        continue
                    assert grad is not None, f"{where}, step {step}: {name} has no gradient after finishing"
                    torch.testing.assert_close(grad, want, msg=lambda m: (
                        f"{where}, step {step}: {name}.grad must be the MEAN of the ranks' gradients (what one "
                        f"process gets from the mean of the ranks' losses on all their rows)\n{m}"))
            for name, param, want in zip(names, result["params"], ref["model"].parameters()):
                torch.testing.assert_close(param, want.detach(), msg=lambda m: (
                    f"{where}: after the steps {name} differs from one process on every rank's rows\n{m}"))
            closing = parts[-1]
            closing = closing[:_position(closing, "close returned")]
            ids = {e[1] for e in closing if e[0] == "all_reduce"}
            waited = {e[1] for e in closing if e[0] in ("wait", "future")}
            assert ids and ids <= waited, (
                f"{where}: close() right after a backward must wait for the all-reduces still in flight before it "
                f"removes the hooks (started {sorted(ids)}, waited on {sorted(waited)})")


# ---------------------------------------------------------------- sampler_indices


def _sampler_driver(module, cases):
    from torch.utils.data import DistributedSampler

    def refused(self, *args, **kwargs):
        raise RuntimeError("DistributedSampler is switched off while sampler_indices is tested: compute the indices")

    DistributedSampler.__init__ = refused
    torch.manual_seed(987_654)  # the caller's global RNG, in some state the sampler must leave as it is
    out = []
    for length, replicas, shuffle, seed, epoch, drop_last in cases:
        per_rank = []
        for rank in range(replicas):
            before = torch.get_rng_state()
            result = module.sampler_indices(length, replicas, rank, shuffle=shuffle, seed=seed, epoch=epoch,
                                            drop_last=drop_last)
            per_rank.append({"types": _result_types(result), "indices": [int(i) for i in result],
                             "rng_unchanged": bool(torch.equal(torch.get_rng_state(), before))})
            torch.rand(1)  # the caller draws between calls: the next call starts from another state
        out.append(per_rank)
    return out


def _torch_sampler(length, replicas, rank, shuffle, seed, epoch, drop_last):
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(length), num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed,
                                 drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


sampler_cases = st.tuples(st.integers(0, 40), st.integers(1, 5), st.booleans(), st.integers(0, 5), st.integers(0, 4),
                          st.booleans())
# Lengths 0, shorter than the world size (padding repeats the whole list), divisible and not; epochs > 0.
SAMPLER_CASES = [(10, 3, True, 0, 0, False), (10, 3, True, 0, 2, False), (10, 3, False, 0, 0, True),
                 (2, 5, True, 1, 0, False), (3, 5, True, 0, 1, True), (0, 2, True, 0, 0, False),
                 (1, 4, False, 0, 0, False), (17, 4, True, 3, 3, True), (12, 4, True, 2, 1, False)]


@pytest.mark.points(2)
@settings(max_examples=5)
@given(cases=st.lists(sampler_cases, min_size=1, max_size=8))
@example(cases=SAMPLER_CASES)
def test_sampler_indices_match_distributed_sampler(cases):
    got = run("ex05", _sampler_driver, cases, timeout=TIMEOUT)
    for (length, replicas, shuffle, seed, epoch, drop_last), per_rank in zip(cases, got):
        for rank, result in enumerate(per_rank):
            where = (f"sampler_indices({length}, {replicas}, {rank}, shuffle={shuffle}, seed={seed}, epoch={epoch}, "
                     f"drop_last={drop_last})")
            assert result["types"][0] == "list" and all(t == "int" for t in result["types"][1]), (
                f"{where} must return a list of Python ints, got {result['types']}")
            want = _torch_sampler(length, replicas, rank, shuffle, seed, epoch, drop_last)
            assert result["indices"] == want, (
                f"{where}: DistributedSampler gives {want}, got {result['indices']} (shuffle with a generator seeded "
                "seed + epoch; pad by repeating from the start, or cut with drop_last; then every num_replicas-th "
                "index from rank)")
            assert result["rng_unchanged"], (
                f"{where} changed the caller's global RNG state (torch.get_rng_state()): shuffle with a "
                "torch.Generator of your own, seeded seed + epoch, not torch.manual_seed, which reseeds everyone's")


def _bad_sampler_driver(module, cases):
    return [exception_raised_by(module.sampler_indices, length, replicas, rank) for length, replicas, rank in cases]


BAD_SAMPLER_CASES = [(10, 3, 3), (10, 3, -1), (10, 0, 0), (10, -2, 0), (-1, 2, 0), (5, 1, 1)]


@pytest.mark.points(1)
def test_sampler_indices_rejects_bad_ranks():
    got = run("ex05", _bad_sampler_driver, BAD_SAMPLER_CASES, timeout=TIMEOUT)
    for (length, replicas, rank), (raised, message) in zip(BAD_SAMPLER_CASES, got):
        assert raised == "ValueError", (
            f"sampler_indices({length}, {replicas}, {rank}) must raise ValueError (num_replicas >= 1, "
            f"0 <= rank < num_replicas, dataset_len >= 0), not {raised} {message}")


# ---------------------------------------------------------------- train_with_accumulation


def _micro_batches(case, rank):
    """This rank's micro-batches: (inputs, targets) pairs of case["rows"] rows each."""
    generator = torch.Generator().manual_seed(10_000 * case["seed"] + 100 * rank)
    return [(torch.randn(case["rows"], 8, generator=generator), torch.randn(case["rows"], 4, generator=generator))
            for _ in range(case["count"])]


def _skewed_loss(output, target):
    """A loss that is not symmetric in its arguments (mse is): loss_fn(targets, outputs) gives another gradient."""
    return F.mse_loss(output, target) + 0.5 * (output - target).mean()


ACCUMULATION_LOSSES = {"mse": F.mse_loss, "skewed": _skewed_loss}


def _accumulation_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _accumulation_driver(rank, world_size, module, cases):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    no_syncs = []
    original_no_sync = DistributedDataParallel.no_sync

    def counted_no_sync(self, *args, **kwargs):
        no_syncs.append(1)
        return original_no_sync(self, *args, **kwargs)

    DistributedDataParallel.no_sync = counted_no_sync
    out = []
    for case in cases:
        model = _accumulation_model(case["seed"])
        ddp_model = DistributedDataParallel(model)
        reduced = []

        def counting_hook(state, bucket, reduced=reduced):
            reduced.append(bucket.buffer().numel())
            return default_hooks.allreduce_hook(state, bucket)

        ddp_model.register_comm_hook(None, counting_hook)
        sgd = torch.optim.SGD(model.parameters(), lr=0.2)
        calls = []

        class Optimizer:  # only zero_grad() and step(), counted
            def zero_grad(self, *args, **kwargs):
                calls.append(["zero_grad", len(reduced)])
                sgd.zero_grad()

            def step(self, *args, **kwargs):
                calls.append(["step", len(reduced)])
                sgd.step()

        micro = _micro_batches(case, rank)
        before = [(x.clone(), y.clone()) for x, y in micro]
        del no_syncs[:]
        loss_fn = ACCUMULATION_LOSSES[case.get("loss", "mse")]
        losses = module.train_with_accumulation(ddp_model, Optimizer(), loss_fn, micro, case["accumulation"])
        out.append({"types": _result_types(losses),
                    "losses": [float(v) for v in losses] if isinstance(losses, (list, tuple)) else None,
                    "params": [p.detach().clone() for p in model.parameters()],
                    "calls": calls, "reduced": len(reduced), "no_sync": len(no_syncs),
                    "unchanged": len(micro) == len(before) and all(
                        torch.equal(x, bx) and torch.equal(y, by) for (x, y), (bx, by) in zip(micro, before))})
    return out


def _windows(case):
    count, size = case["count"], int(case["accumulation"])  # 2.0 micro-batches per step is 2
    return [list(range(start, min(start + size, count))) for start in range(0, count, size)]


def _accumulation_reference(case, world_size):
    """One process, one step per window on the window's micro-batches of every rank together; each rank's loss."""
    model = _accumulation_model(case["seed"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    loss_fn = ACCUMULATION_LOSSES[case.get("loss", "mse")]  # a mean over rows: the union's is the mean of means
    batches = [_micro_batches(case, rank) for rank in range(world_size)]
    losses = [[] for _ in range(world_size)]
    for window in _windows(case):
        with torch.no_grad():
            for rank in range(world_size):
                losses[rank].append(sum(loss_fn(model(batches[rank][i][0]), batches[rank][i][1]).item()
                                        for i in window) / len(window))
        x = torch.cat([batches[rank][i][0] for rank in range(world_size) for i in window])
        y = torch.cat([batches[rank][i][1] for rank in range(world_size) for i in window])
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    return model, losses


accumulation_cases = st.fixed_dictionaries({"accumulation": st.integers(1, 4) | st.integers(1, 4).map(float),
                                            "count": st.integers(1, 7),
                                            "rows": st.integers(1, 3), "seed": st.integers(0, 1000),
                                            "loss": st.sampled_from(sorted(ACCUMULATION_LOSSES))})
ACCUMULATION_CASES = [{"accumulation": 3, "count": 7, "rows": 2, "seed": 1, "loss": "skewed"},
                      {"accumulation": 4.0, "count": 4, "rows": 1, "seed": 2},   # a count: 4.0 is 4
                      {"accumulation": 1, "count": 2, "rows": 3, "seed": 3}]


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [1, 2, 3])
@settings(max_examples=2)
@given(cases=st.lists(accumulation_cases, min_size=1, max_size=3))
@example(cases=ACCUMULATION_CASES)
def test_train_with_accumulation_matches_one_big_batch(world_size, cases):
    got = run("ex05", _accumulation_driver, cases, world_size=world_size, timeout=TIMEOUT)
    for index, case in enumerate(cases):
        reference, losses = _accumulation_reference(case, world_size)
        steps = len(_windows(case))
        for rank in range(world_size):
            result = got[rank][index]
            loss_name = ACCUMULATION_LOSSES[case.get("loss", "mse")].__name__
            where = (f"rank {rank} of {world_size}, {case['count']} micro-batches of {case['rows']} rows, "
                     f"accumulation_steps={case['accumulation']}, loss_fn={loss_name}")
            assert result["types"][0] == "list" and all(t == "float" for t in result["types"][1]), (
                f"{where}: return a list of Python floats, one per optimizer step, got {result['types']}")
            assert len(result["losses"]) == steps, (
                f"{where}: {steps} optimizer steps (the last window may be shorter: it still gets its step), so "
                f"{steps} losses, got {len(result['losses'])}")
            assert result["losses"] == pytest.approx(losses[rank], rel=1e-5, abs=1e-6), (
                f"{where}: each step's loss is the mean of the undivided losses of the window's micro-batches on this "
                f"rank, before the step: {losses[rank]}, got {result['losses']}")
            for (name, want), param in zip(reference.named_parameters(), result["params"]):
                torch.testing.assert_close(param, want.detach(), msg=lambda m: (
                    f"{where}: {name} after training differs from one process taking one step per window on the "
                    "window's micro-batches of every rank together (zero the gradients once per window, divide each "
                    f"loss by the window's length)\n{m}"))
            assert result["unchanged"], f"{where}: micro_batches must be left as they were"


STEP_CASES = [{"accumulation": 3, "count": 7, "rows": 2, "seed": 4},
              {"accumulation": 2, "count": 4, "rows": 1, "seed": 5},
              {"accumulation": 1, "count": 3, "rows": 2, "seed": 6},
              {"accumulation": 5, "count": 2, "rows": 1, "seed": 7}]


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2])
def test_train_with_accumulation_all_reduces_once_per_step(world_size):
    got = run("ex05", _accumulation_driver, STEP_CASES, world_size=world_size, timeout=TIMEOUT)
    for rank, case, result in [(r, c, res) for r in range(world_size) for c, res in zip(STEP_CASES, got[r])]:
        windows = _windows(case)
        where = f"rank {rank} of {world_size}, {case['count']} micro-batches, accumulation_steps={case['accumulation']}"
        steps = [count for call, count in result["calls"] if call == "step"]
        assert len(steps) == len(windows), (
            f"{where}: one optimizer step per window of accumulation_steps micro-batches (the tail included): "
            f"{len(windows)}, got {len(steps)}")
        assert steps == list(range(1, len(windows) + 1)) and result["reduced"] == len(windows), (
            f"{where}: exactly one all-reduce before each optimizer step (the last micro-batch's backward), "
            f"{len(windows)} in all; DDP all-reduced {result['reduced']} times, and before the steps "
            f"{steps} times in all: run every other micro-batch inside ddp_model.no_sync()")
        want = sum(len(window) - 1 for window in windows)
        assert result["no_sync"] == want, (
            f"{where}: ddp_model.no_sync() around every micro-batch but each window's last: {want} times, got "
            f"{result['no_sync']} (do not flip DDP's private flags instead)")


def _bad_accumulation_driver(rank, world_size, module, values):
    model = nn.parallel.DistributedDataParallel(_accumulation_model(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    micro = _micro_batches({"seed": 0, "rows": 1, "count": 2}, rank)
    return [exception_raised_by(module.train_with_accumulation, model, optimizer, F.mse_loss, micro, value)
            for value in values]


@pytest.mark.points(1)
def test_train_with_accumulation_rejects_bad_steps():
    values = [0, -1, 1.5, True, 0.0, float("nan"), float("inf"), "2"]  # a count: not a bool, not a fraction
    got = run("ex05", _bad_accumulation_driver, values, world_size=1, timeout=TIMEOUT)
    for value, (raised, message) in zip(values, got[0]):
        assert raised == "ValueError" and "accumulation_steps" in message, (
            f"train_with_accumulation(..., accumulation_steps={value!r}) must raise ValueError naming "
            f"accumulation_steps and saying what to pass (a whole number, 1 or more: an int or an integral float), "
            f"not {raised} {message}")


# ---------------------------------------------------------------- fp16_compress_hook


def _hook_driver(rank, world_size, module, cases):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    out = []
    with _AllReduceLog() as log:
        log.active = False  # DDP's constructor and new_group are not the hook's
        for case in cases:
            group = dist.new_group(list(range(world_size))) if case["group"] == "new" else None
            name = (group if group is not None else dist.group.WORLD).group_name
            models, ddps, optimizers = [], [], []
            for hook in (module.fp16_compress_hook, default_hooks.fp16_compress_hook):
                torch.manual_seed(case["seed"])
                model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
                ddp_model = DistributedDataParallel(model, process_group=group)
                ddp_model.register_comm_hook(group, hook)
                models.append(model)
                ddps.append(ddp_model)
                optimizers.append(torch.optim.SGD(model.parameters(), lr=case["lr"]))
            grads = []
            for step in range(case["steps"]):
                x, y = _global_batch(case["seed"], step, world_size, 2)
                mine = slice(2 * rank, 2 * rank + 2)
                step_grads = []
                for which, (ddp_model, optimizer) in enumerate(zip(ddps, optimizers)):
                    log.active = which == 0  # log the learner's hook only
                    if which == 0:
                        log.mark(f"step {step}")
                    optimizer.zero_grad()
                    output = ddp_model(x[mine])
                    loss = (output * case["scale"]).sum() / 2 if case["scale"] != 1 else F.mse_loss(output, y[mine])
                    loss.backward()
                    log.active = False
                    step_grads.append([p.grad.detach().clone() for p in ddp_model.module.parameters()])
                    optimizer.step()
                grads.append(step_grads)
            out.append({"grads": grads, "group": name, "events": [e for e in log.events]})
            del log.events[:]
    return out


HOOK_CASES = [{"group": "none", "seed": 1, "steps": 3, "scale": 1, "lr": 0.2},
              {"group": "new", "seed": 2, "steps": 2, "scale": 1, "lr": 0.2}]


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 3])
def test_fp16_compress_hook_matches_torchs_hook(world_size):
    got = run("ex05", _hook_driver, HOOK_CASES, world_size=world_size, timeout=TIMEOUT)
    for rank in range(world_size):
        for case, result in zip(HOOK_CASES, got[rank]):
            group = "None" if case["group"] == "none" else "a new_group"
            where = f"rank {rank} of {world_size}, process_group {group}"
            reduces = [e for e in result["events"] if e[0] == "all_reduce"]
            assert reduces, f"{where}: the hook must all-reduce the bucket with dist.all_reduce"
            assert all(e[3] == "torch.float16" for e in reduces), (
                f"{where}: all-reduce a float16 copy of the bucket (half the bytes), got dtypes "
                f"{sorted({e[3] for e in reduces})}")
            assert all(e[4] is True for e in reduces), (
                f"{where}: start the all-reduce with async_op=True and return work.get_future().then(...): the hook "
                "must not wait")
            assert all(e[5] == result["group"] for e in reduces), (
                f"{where}: all-reduce on the process group DDP passes the hook (the default group when it is None)")
            for step, (mine, theirs) in enumerate(result["grads"]):
                for index, (grad, want) in enumerate(zip(mine, theirs)):
                    torch.testing.assert_close(grad, want, rtol=2e-3, atol=1e-6, msg=lambda m: (
                        f"{where}, step {step}, parameter {index}: the gradient DDP gets from your hook differs from "
                        f"torch's fp16_compress_hook's (cast to float16, divide by the group's size, all-reduce, copy "
                        f"back into bucket.buffer())\n{m}"))


@pytest.mark.points(1)
@pytest.mark.parametrize("world_size", [2])
def test_fp16_compress_hook_divides_before_the_sum(world_size):
    # Gradients of 40000 on every rank: in float16 (largest 65504) their sum overflows, their average does not.
    cases = [{"group": "none", "seed": 3, "steps": 1, "scale": 40000.0, "lr": 0.0}]
    got = run("ex05", _hook_driver, cases, world_size=world_size, timeout=TIMEOUT)
    for rank in range(world_size):
        for mine, theirs in got[rank][0]["grads"]:
            for grad, want in zip(mine, theirs):
                assert torch.isfinite(grad).all(), (
                    f"rank {rank}: gradients of about 40000 per rank became inf: their float16 sum overflows "
                    "(65504 is float16's largest); divide by the group's size BEFORE the all-reduce")
                torch.testing.assert_close(grad, want, rtol=2e-3, atol=1e-3)


def _hook_future_driver(rank, world_size, module, cases):
    """Call the learner's hook yourself, inside a comm hook of torch's DDP (the only way to get a real GradBucket),
    and torch's fp16_compress_hook on a copy of the same bucket, in the same ranks and group: what each future
    holds and what the bucket's buffer holds afterwards. Ranks outside a subgroup build no DDP and call nothing."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    out = []
    for case in cases:
        members = list(range(world_size)) if case["group"] != "subgroup" else [0, 1]
        group = dist.new_group(members) if case["group"] != "none" else None  # every rank calls new_group
        seen = []
        if rank in members:
            def probe(state, bucket):
                before = bucket.buffer().clone()
                theirs = default_hooks.fp16_compress_hook(state, (before.clone(),)).wait()
                future = module.fp16_compress_hook(state, bucket)
                value = future.wait()
                seen.append({"type": type(value).__name__,
                             "dtype": str(value.dtype) if isinstance(value, torch.Tensor) else "",
                             "value": value.detach().clone() if isinstance(value, torch.Tensor) else None,
                             "buffer": bucket.buffer().detach().clone(), "before": before,
                             "theirs": theirs.detach().clone()})
                return future

            torch.manual_seed(case["seed"])
            model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
            ddp_model = DistributedDataParallel(model, process_group=group)
            ddp_model.register_comm_hook(group, probe)
            x, y = _global_batch(case["seed"], 0, world_size, 2)
            mine = slice(2 * rank, 2 * rank + 2)
            (F.mse_loss(ddp_model(x[mine]), y[mine]) * case["scale"]).backward()
        out.append({"members": members, "seen": seen})
    return out


@st.composite
def hook_cases(draw):
    return {"group": draw(st.sampled_from(["none", "whole", "subgroup"])), "seed": draw(st.integers(0, 1000)),
            "scale": draw(st.sampled_from([1.0, 100.0, 1e-3]))}


HOOK_FUTURE_CASES = [{"group": "subgroup", "seed": 4, "scale": 1.0}, {"group": "none", "seed": 5, "scale": 100.0},
                     {"group": "whole", "seed": 6, "scale": 1.0}]


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [3])
@settings(max_examples=2)
@given(cases=st.lists(hook_cases(), min_size=1, max_size=3))
@example(cases=HOOK_FUTURE_CASES)
def test_fp16_compress_hook_future_holds_the_mean(world_size, cases):
    got = run("ex05", _hook_future_driver, cases, world_size=world_size, timeout=TIMEOUT)
    for index, case in enumerate(cases):
        group = {"none": "None (the default group)", "whole": "a new_group of every rank",
                 "subgroup": "a new_group of ranks 0 and 1 (rank 2 is outside it and calls nothing)"}[case["group"]]
        for rank in range(world_size):
            result = got[rank][index]
            where = f"rank {rank} of {world_size}, process_group {group}"
            if rank not in result["members"]:
                continue
            assert result["seen"], f"{where}: DDP called no comm hook"
            for call in result["seen"]:
                assert call["type"] == "Tensor" and call["dtype"] == "torch.float32", (
                    f"{where}: the future the hook returns must hold the bucket's buffer, float32 (decompress copies "
                    f"the float16 result back into it and returns it), got {call['type']} {call['dtype']}")
                # Tolerance: float16 keeps 11 significant bits, so a learner's hook and torch's may round the
                # division a half-ulp apart (2**-11 relative each, two roundings): rtol 2e-3 as in the test above.
                torch.testing.assert_close(call["value"], call["theirs"], rtol=2e-3, atol=1e-6, msg=lambda m: (
                    f"{where}: the future's value must be the group's MEAN of the bucket, what torch's "
                    f"fp16_compress_hook gives (cast to float16, divide by the size of the group the hook was "
                    f"given, all-reduce on that group)\n{m}"))
                torch.testing.assert_close(call["buffer"], call["theirs"], rtol=2e-3, atol=1e-6, msg=lambda m: (
                    f"{where}: afterwards bucket.buffer() must hold the group's mean too (copy the all-reduced "
                    f"float16 values back into it, in place)\n{m}"))
