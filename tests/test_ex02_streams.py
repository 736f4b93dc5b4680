"""Graded tests for exercise 02: streams and asynchronous execution.

Each test reaches the learner's code through `run`, in a child process, and gets plain data back. The CUDA
parts are graded on any machine against a simulated GPU (course_lib.grading.simgpu: a model of several devices,
their streams, events, copies and the caching allocator, installed in the child while the learner's code runs,
never in this process); tests marked gpu(1) also run them on a real GPU. References are computed here,
independently of the code graded: a schedule played out in plain Python, torch's own cross-entropy, the batches
as drawn. The simulated scenarios vary what a caller may vary: the device (cuda:1 while cuda:0 is current), the
caller's stream (inside `with torch.cuda.stream(s)`), the batches' structure, and the loader's passes.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import math
import statistics
from collections import OrderedDict, UserDict, defaultdict

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from course_lib.grading import exception_raised_by, run
from course_lib.grading.properties import batch_tensors, nested, plain_values
from course_lib.grading.simgpu import SimulatedGPU


@contextlib.contextmanager
def _caller_context(gpu, device_index, current_device, own_stream):
    """What the caller of the learner's code sets up: a current device, and maybe its own stream on `device_index`.

    Returns (through `as`) the stream the caller's work runs on: `device_index`'s current stream.
    """
    with contextlib.ExitStack() as stack:
        if own_stream:  # makes device_index current too: select current_device again inside
            stack.enter_context(torch.cuda.stream(torch.cuda.Stream(device_index)))
        stack.enter_context(torch.cuda.device(current_device))
        yield torch.cuda.current_stream(device_index)


def _context_now(gpu):
    """The current device and each device's current stream: what a call must leave as it found it."""
    return [gpu.current_device, *(d.current.stream_id for d in gpu.devices)]


# ---------------------------------------------------------------- time_device


def _durations(count):
    return [0.001 * (j + 1) for j in range(count)]  # call j takes (j + 1) ms: a timer that mixes calls up is caught


def _time_on_cpu(module, cases):
    results = []
    with SimulatedGPU(modules=[module]) as gpu:  # on the cpu path only its clock matters: fn spends simulated host time
        for warmup, repeat in cases:
            durations, calls = _durations(warmup + repeat), []

            def fn():
                gpu.host_work(durations[len(calls)])
                calls.append(1)

            times = module.time_device(fn, "cpu", warmup=warmup, repeat=repeat)
            results.append({"times": [float(t) for t in times], "calls": len(calls), "type": type(times).__name__,
                            "item types": sorted({type(t).__name__ for t in times})})
    # And once for real, without the simulation: the cpu path must not touch CUDA on a machine without a GPU.
    real = module.time_device(lambda: None, torch.device("cpu"), warmup=1, repeat=2)
    return {"simulated": results, "real": [float(t) for t in real]}


TIMER_CASES = [(3, 5), (0, 1), (2, 4)]


@pytest.mark.points(2)
def test_time_device_times_each_call_after_the_warmup_on_the_cpu():
    got = run("ex02", _time_on_cpu, TIMER_CASES)
    for (warmup, repeat), result in zip(TIMER_CASES, got["simulated"]):
        expected = _durations(warmup + repeat)[warmup:]
        assert result["calls"] == warmup + repeat, (
            f"warmup={warmup}, repeat={repeat}: fn must be called {warmup + repeat} times, was {result['calls']}")
        assert result["type"] == "list" and result["item types"] == ["float"], (
            f"return a list of Python floats; you returned a {result['type']} of {result['item types']}")
        assert len(result["times"]) == repeat, f"return {repeat} durations, one per timed call"
        assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(result["times"], expected)), (
            f"warmup={warmup}: the timed calls took {expected} s; your timer returned {result['times']}")
    assert len(got["real"]) == 2 and all(t >= 0 for t in got["real"])


def _time_on_simulated_gpu(module, scenarios):
    """Each scenario: (the device argument, the current device, the device fn's work runs on, the caller's own
    stream or not). fn queues kernels on the work device's current stream, as `lambda: a @ a` with `a` there does;
    the other device is kept busy with long work that no timing should include."""
    results = []
    for device, current, work, own_stream in scenarios:
        with SimulatedGPU(modules=[module], devices=2) as gpu:
            durations, calls = _durations(3 + 4), []

            def fn():  # queues a kernel and returns at once, as a real launch does
                gpu.kernel(durations[len(calls)], name=f"call {len(calls)}", device=work)
                calls.append(1)

            gpu.kernel(100.0, name="another device's work", device=1 - work)
            result = {"times": [], "calls": 0, "error": None, "type": None, "item types": []}
            with _caller_context(gpu, work, current, own_stream):
                before = _context_now(gpu)
                try:
                    times = module.time_device(fn, device, warmup=3, repeat=4)
                    result.update(times=[float(t) for t in times], type=type(times).__name__,
                                  **{"item types": sorted({type(t).__name__ for t in times})})
                except NotImplementedError:
                    raise
                except Exception as exc:  # noqa: BLE001 - e.g. reading an event before the GPU reached it
                    result["error"] = f"{type(exc).__name__}: {exc}"
                result["context kept"] = _context_now(gpu) == before
            result["calls"] = len(calls)
            results.append(result)
    return results


def _check_device_timings(scenarios, results):
    expected = _durations(7)[3:]
    for (device, current, work, own_stream), result in zip(scenarios, results):
        where = (f"time_device(fn, {device!r}) with cuda:{current} current, fn's work on cuda:{work}"
                 + (" on the caller's own stream" if own_stream else ""))
        assert result["error"] is None, f"{where}: {result['error']}"
        assert result["calls"] == 7, f"{where}: fn must be called warmup + repeat = 7 times, was {result['calls']}"
        assert result["type"] == "list" and result["item types"] == ["float"], (
            f"{where}: return a list of Python floats; you returned a {result['type']} of {result['item types']}")
        times = result["times"]
        assert len(times) == 4, f"{where}: return repeat = 4 durations, got {len(times)}"
        if all(t < 1e-9 for t in times):
            raise AssertionError(f"{where}: every time is 0 s. Either the host measured how long it took to *queue* "
                                 "the work (time GPU work with CUDA events, or synchronize), or the events were "
                                 "recorded on a stream that fn's work does not run on (another device, or the "
                                 "default stream instead of the current one)")
        assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(times, expected)), (
            f"{where}: the kernels took {expected} s on the (simulated) GPU; your timer returned {times}. Seconds, "
            "not milliseconds; events on the device given, around each call; and did other work end up in a timing?")
        assert result["context kept"], (
            f"{where}: after time_device the current device or a current stream had changed: select the device "
            "with `with torch.cuda.device(device):`, which puts the previous one back")


GPU_DEVICES = [("cuda", 0, 0, False), ("cuda:0", 0, 0, False), (torch.device("cuda", 0), 0, 0, False)]


@pytest.mark.points(3)
def test_time_device_times_queued_gpu_work_on_a_simulated_gpu():
    _check_device_timings(GPU_DEVICES, run("ex02", _time_on_simulated_gpu, GPU_DEVICES))


OTHER_DEVICES = [("cuda:1", 0, 1, False), (torch.device("cuda", 0), 1, 0, False), ("cuda", 1, 1, True),
                 ("cuda:1", 0, 1, True), ("cuda:0", 0, 0, True)]


@pytest.mark.points(2)
def test_time_device_times_the_device_it_is_given_on_its_current_stream():
    # Event.record() and torch.cuda.synchronize() without arguments concern the *current* device and its current
    # stream (torch/cuda/streams.py, torch/cuda/__init__.py): timing cuda:1 needs cuda:1 selected.
    _check_device_timings(OTHER_DEVICES, run("ex02", _time_on_simulated_gpu, OTHER_DEVICES))

def _bad_timer_arguments(module):
    return [exception_raised_by(module.time_device, 3, "cpu"),
            exception_raised_by(module.time_device, lambda: None, "cpu", warmup=-1),
            exception_raised_by(module.time_device, lambda: None, "cpu", repeat=0)]


@pytest.mark.points(1)
def test_time_device_rejects_bad_arguments():
    raised = run("ex02", _bad_timer_arguments)
    kinds = [kind for kind, _ in raised]
    assert kinds == ["TypeError", "ValueError", "ValueError"], (
        f"expected TypeError for a non-callable fn and ValueError for warmup < 0 or repeat < 1, got {kinds}")
    # Calling 3() raises a TypeError too, but Python's own ("'int' object is not callable") does not say which
    # argument is wrong: the docstring asks for a message that names fn.
    assert "fn" in raised[0][1], f"time_device(3, 'cpu')'s TypeError should name fn, got {raised[0][1]!r}"


def _time_on_real_gpu(module):
    device = torch.device("cuda", 0)
    a = torch.randn(4096, 4096, device=device)
    got = module.time_device(lambda: a @ a, device, warmup=3, repeat=10)
    torch.cuda.synchronize(device)
    reference = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ a
        end.record()
        end.synchronize()
        reference.append(start.elapsed_time(end) / 1e3)
    return {"got": [float(t) for t in got], "reference": reference}


@pytest.mark.gpu(1)
@pytest.mark.points(2)
def test_time_device_on_a_real_gpu():
    result = run("ex02", _time_on_real_gpu)
    got, reference = statistics.median(result["got"]), statistics.median(result["reference"])
    assert len(result["got"]) == 10
    assert 0.7 * reference <= got <= 1.4 * reference, (
        f"a 4096x4096 matmul takes {reference * 1e3:.3f} ms (CUDA events); your timer said {got * 1e3:.3f} ms")


# ---------------------------------------------------------------- pipeline_time


def _schedule(n, copy, compute, overlapped):
    """The schedule played out batch by batch: the reference for pipeline_time."""
    copy_done = compute_done = 0.0
    for _ in range(n):
        copy_done = (copy_done if overlapped else compute_done) + copy
        compute_done = max(copy_done, compute_done) + compute
    return compute_done


PIPELINES = [(1, 4.95, 2.83), (8, 4.95, 2.83), (8, 2.83, 4.95), (5, 1.0, 1.0), (0, 3.0, 2.0), (3, 0.0, 2.0),
             (10, 7, 3), (2, 0.5, 0.25), (100, 0.013, 0.017)]


def _pipelines(module, cases):
    results = []
    for n, c, k in cases:
        args = copy.deepcopy((n, c, k))
        values = [module.pipeline_time(n, c, k, overlapped=o) for o in (False, True)]
        results.append({"values": [float(v) if isinstance(v, (int, float)) else math.nan for v in values],
                        "types": [type(v).__name__ for v in values], "unchanged": (n, c, k) == args})
    return results


def _check_pipelines(cases, results):
    for (n, c, k), result in zip(cases, results):
        for name, got, kind, want in [("serial", result["values"][0], result["types"][0], _schedule(n, c, k, False)),
                                      ("overlapped", result["values"][1], result["types"][1],
                                       _schedule(n, c, k, True))]:
            assert kind == "float", (
                f"pipeline_time({n}, {c!r}, {k!r}, overlapped={name == 'overlapped'}) must return a float, "
                f"returned a {kind}")
            assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9), (
                f"{n} batches, copy {c}, compute {k}, {name}: the schedule takes {want:g}, you said {got:g}")


@pytest.mark.points(3)
def test_pipeline_time_matches_the_schedule():
    _check_pipelines(PIPELINES, run("ex02", _pipelines, PIPELINES))


_TIMES = st.one_of(st.integers(0, 20), st.floats(0, 100, allow_nan=False, allow_infinity=False))


@pytest.mark.points(2)
@settings(max_examples=8)
@given(cases=st.lists(st.tuples(st.integers(0, 40), _TIMES, _TIMES), min_size=1, max_size=6))
@example(cases=[(3, 2.0, 1.0)])  # explicit examples run first: an unfinished stub fails here, without shrinking
def test_pipeline_time_matches_the_schedule_for_any_sizes(cases):
    # Any number of batches, integer or float times, zeros included: the formula against the schedule played out.
    _check_pipelines(cases, run("ex02", _pipelines, cases))


def _huge_pipelines(module, n):
    return [[float(module.pipeline_time(n, c, k, overlapped=o)) for o in (False, True)] for c, k in [(2.0, 3.0), (3.0, 2.0)]]


def _extrapolated_schedule(n, copy, compute, overlapped):
    """The schedule for n batches, from the loop's: after the first batch each one adds the same time."""
    step = _schedule(3, copy, compute, overlapped) - _schedule(2, copy, compute, overlapped)
    assert all(math.isclose(_schedule(m + 1, copy, compute, overlapped) - _schedule(m, copy, compute, overlapped), step)
               for m in range(1, 30))
    return _schedule(1, copy, compute, overlapped) + (n - 1) * step


@pytest.mark.points(1)
def test_pipeline_time_is_a_formula():
    n = 10**9
    got = run("ex02", _huge_pipelines, n, timeout=15)  # a loop over 10**9 batches takes minutes
    for (c, k), (serial, overlapped) in zip([(2.0, 3.0), (3.0, 2.0)], got):
        for name, value, o in [("serial", serial, False), ("overlapped", overlapped, True)]:
            want = _extrapolated_schedule(n, c, k, o)
            assert math.isclose(value, want, rel_tol=1e-9), (
                f"a billion batches, copy {c}, compute {k}, {name}: expected {want:g}, got {value:g}")


def _bad_pipelines(module):
    return [exception_raised_by(module.pipeline_time, *args, overlapped=True)
            for args in [(-1, 1.0, 1.0), (3, -0.5, 1.0), (3, 1.0, -2.0), (3, 1.0, -0.5)]]


@pytest.mark.points(1)
def test_pipeline_time_rejects_bad_arguments():
    kinds = [kind for kind, _ in run("ex02", _bad_pipelines)]
    assert kinds == ["ValueError"] * 4, f"negative batches or times need a ValueError, got {kinds}"


# ---------------------------------------------------------------- map_tensors and the batches' structure

Pair = collections.namedtuple("Pair", "image label")


def _picture(x, tensor=None):
    """A plain-data picture of a batch: container types (a defaultdict's factory too), keys, order and leaves.

    `tensor(t)` pictures a tensor (by default its dtype, shape and values); anything else is its type and repr.
    """
    if isinstance(x, torch.Tensor):
        return tensor(x) if tensor is not None else {"tensor": [str(x.dtype), list(x.shape), x.tolist()]}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return {type(x).__name__: [_picture(v, tensor) for v in x]}
    if isinstance(x, defaultdict):
        return {f"defaultdict({getattr(x.default_factory, '__name__', x.default_factory)})":
                [[k, _picture(v, tensor)] for k, v in x.items()]}
    if isinstance(x, (dict, UserDict)):
        return {type(x).__name__: [[k, _picture(v, tensor)] for k, v in x.items()]}
    if isinstance(x, (list, tuple)):
        return {type(x).__name__: [_picture(v, tensor) for v in x]}
    return {"value": [type(x).__name__, repr(x)]}


def _parts(x):
    """(the containers, the non-tensor leaves) of a batch, in order."""
    if isinstance(x, torch.Tensor):
        return [], []
    if isinstance(x, (dict, UserDict)):
        values = list(x.values())
    elif isinstance(x, (list, tuple)):
        values = list(x)
    else:
        return [], [x]
    containers, leaves = [x], []
    for value in values:
        more, others = _parts(value)
        containers += more
        leaves += others
    return containers, leaves


def _postconditions(before, batch, result, made=()):
    """What map_tensors and Prefetcher promise besides the values: `batch` unchanged, new containers (none of the
    input's mutable ones handed back), and the very same non-tensor objects (`made`: what fn returned)."""
    in_containers, in_leaves = _parts(batch)
    out_containers, out_leaves = _parts(result)
    out_leaves = [leaf for leaf in out_leaves if not any(leaf is m for m in made)]
    mutable = {id(c) for c in in_containers if not isinstance(c, tuple)}
    return {"unchanged": _picture(batch) == before,
            "new containers": not any(id(c) in mutable for c in out_containers),
            "same objects": len(in_leaves) == len(out_leaves) and all(a is b for a, b in zip(in_leaves, out_leaves))}


def _map_tensors(module, cases):
    results = []
    for batch in cases:
        before, made = _picture(batch), []

        def fn(t):
            made.append(f"fn #{len(made)} of a {t.dtype} {list(t.shape)} tensor")
            return made[-1]

        result = module.map_tensors(batch, fn)
        results.append({"picture": _picture(result), **_postconditions(before, batch, result, made)})
    return results


def _mapped(x, counter):
    """The reference: the picture of `x` with tensor number i replaced by fn's string, in the order of a walk."""
    if isinstance(x, torch.Tensor):
        counter.append(1)
        return {"value": ["str", repr(f"fn #{len(counter) - 1} of a {x.dtype} {list(x.shape)} tensor")]}
    if not isinstance(x, (dict, UserDict, list, tuple)):
        return _picture(x)
    (kind,) = _picture(x, tensor=lambda t: None).keys()
    if isinstance(x, (dict, UserDict)):
        return {kind: [[k, _mapped(v, counter)] for k, v in x.items()]}
    return {kind: [_mapped(v, counter) for v in x]}


_LEAVES = st.one_of(batch_tensors(), plain_values())
_BATCHES = st.one_of(st.none(), _LEAVES, nested(_LEAVES))  # every container kind: dict, OrderedDict, defaultdict,
# UserDict, list, tuple, namedtuples, nested in each other (lists and tuples inside dicts included)


@pytest.mark.points(2)
@settings(max_examples=10)
@given(cases=st.lists(_BATCHES, min_size=1, max_size=5))
@example(cases=[{"x": torch.ones(2), "n": 1}])  # run first: an unfinished stub fails here, without shrinking
def test_map_tensors_keeps_any_structure(cases):
    for batch, result in zip(cases, run("ex02", _map_tensors, cases)):
        want = _mapped(batch, [])
        assert result["picture"] == want, (
            f"map_tensors(batch, fn) with batch = {_picture(batch)}: expected {want}, got {result['picture']}. Keep "
            "every container's type (OrderedDict, defaultdict and its default_factory, UserDict, namedtuples), "
            "its keys and order, call fn once per tensor, and leave other values as they are")
        assert result["unchanged"], f"map_tensors changed its input batch {_picture(batch)}: build new containers"
        assert result["new containers"], (
            f"map_tensors handed back one of the input's own lists or dicts (batch {_picture(batch)}): the result "
            "must not share mutable containers with the input")
        assert result["same objects"], (
            f"the non-tensor values of {_picture(batch)} must come back as the very same objects, not copies")


# ---------------------------------------------------------------- Prefetcher on cpu and meta


class _Loader:
    """A loader that logs when each batch is taken from it, has a length, and may give other batches on each pass
    (as a shuffling DataLoader does): pass k gives passes[k % len(passes)]."""

    def __init__(self, passes, log):
        self.passes, self.log, self.count = passes, log, 0

    def __len__(self):
        return len(self.passes[0])

    def __iter__(self):
        batches = self.passes[self.count % len(self.passes)]
        self.count += 1
        for i, batch in enumerate(batches):
            self.log.append(f"loader gave {i}")
            yield batch


def _cpu_passes():
    first = [
        {"x": torch.arange(6.0).reshape(2, 3), "y": torch.tensor([1, 0]), "name": "first"},
        (torch.ones(2, 2), torch.zeros(2, dtype=torch.int64)),
        [Pair(torch.full((3,), 7.0), 3), None, "text"],
        torch.arange(4),
        None,
        OrderedDict(ids=[torch.tensor([5, 6]), (torch.tensor(2.5), "s")], mask=torch.tensor([True, False])),
        UserDict({"x": torch.eye(2), "n": 4}),
    ]
    second = [  # the next pass gives other batches (shuffled, augmented): a prefetcher must not replay the first
        UserDict({"x": torch.eye(3), "n": 5}),
        [Pair(torch.full((2,), -1.0), 1), "other"],
        {"x": torch.arange(4.0).reshape(2, 2), "lists": [torch.tensor([9]), [torch.tensor(1.5)]], "name": "second"},
        None,
        torch.arange(3, 7),
        (torch.zeros(1, 2), torch.ones(3, dtype=torch.int64)),
        defaultdict(list, {"y": torch.tensor([3, 1])}),
    ]
    return [first, second]


def _picture_on(device, with_values):
    def tensor(t):
        return {"tensor": [device, str(t.dtype), list(t.shape), t.tolist() if with_values else None]}
    return tensor


def _prefetch_cpu(module, device, passes):
    log, before = [], _picture(passes)
    prefetcher = module.Prefetcher(_Loader(passes, log), device)
    got, checks = [], []
    for k in range(2):
        got.append([])
        for batch, given in zip(prefetcher, passes[k] + [None] * 8):
            got[-1].append(_picture(batch, _tensor_where_it_is))
            checks.append(_postconditions(_picture(given), given, batch)["same objects"])
    empty = list(module.Prefetcher(_Loader([[]], []), device))
    return {"passes": got, "length": len(prefetcher), "empty": len(empty), "same objects": all(checks),
            "unchanged": _picture(passes) == before}


def _tensor_where_it_is(t):
    return {"tensor": [t.device.type, str(t.dtype), list(t.shape), t.tolist() if t.device.type == "cpu" else None]}


@pytest.mark.points(2)
def test_prefetcher_yields_the_loader_batches_in_order():
    passes = _cpu_passes()
    for device in ["cpu", "meta", torch.device("meta")]:
        kind = torch.device(device).type
        got = run("ex02", _prefetch_cpu, device, passes)
        for number, (one_pass, batches) in enumerate(zip(got["passes"], passes), 1):
            want = [_picture(b, _picture_on(kind, kind == "cpu")) for b in batches]
            assert len(one_pass) == len(want), (
                f"device {device!r}, pass {number}: the loader gave {len(want)} batches, the prefetcher "
                f"{len(one_pass)}")
            for i, (a, b) in enumerate(zip(one_pass, want)):
                assert a == b, (f"device {device!r}, pass {number}, batch {i}: expected {b}, got {a}"
                                + (" (the second pass gives other batches than the first)" if number == 2 else ""))
        assert got["length"] == len(passes[0]), "len(prefetcher) must be len(loader)"
        assert got["empty"] == 0, "an empty loader gives no batches"
        assert got["same objects"], "values other than tensors (None, numbers, strings) must be handed out as they are"
        assert got["unchanged"], "the prefetcher changed the loader's batches: move copies, leave the batches alone"


# The scenarios every simulated prefetcher test runs: (Prefetcher's device, its index, the current device, whether
# the caller iterates inside `with torch.cuda.stream(its own stream)`).
SCENARIOS = [("cuda", 0, 0, False), (torch.device("cuda", 0), 0, 0, True), ("cuda:1", 1, 0, False),
             (torch.device("cuda", 1), 1, 0, True)]


def _where(scenario):
    device, index, current, own_stream = scenario
    return (f"Prefetcher(loader, {device!r}) with cuda:{current} current"
            + (f", the caller on its own stream of cuda:{index}" if own_stream
               else ", the caller on the default stream"))


def _one_ahead(module, count, scenario):
    log = []
    loader = _Loader([[torch.full((4,), float(i)) for i in range(count)]], log)
    if scenario is None:
        prefetcher = module.Prefetcher(loader, "cpu")
        log.append("constructed")
        for i, _ in enumerate(prefetcher):
            log.append(f"caller got {i}")
        return log
    device, index, current, own_stream = scenario
    with SimulatedGPU(modules=[module], devices=2) as gpu, _caller_context(gpu, index, current, own_stream):
        prefetcher = module.Prefetcher(loader, device)
        log.append("constructed")
        for i, _ in enumerate(prefetcher):
            log.append(f"caller got {i}")
    return log


def _expected_one_ahead(count):
    log = ["constructed"] + (["loader gave 0"] if count else [])
    for i in range(count):
        if i + 1 < count:
            log.append(f"loader gave {i + 1}")
        log.append(f"caller got {i}")
    return log


@pytest.mark.points(2)
def test_prefetcher_stays_exactly_one_batch_ahead():
    for scenario in (None, SCENARIOS[0], SCENARIOS[3]):
        for count in (4, 1, 0):
            got = run("ex02", _one_ahead, count, scenario)
            where = "on the cpu" if scenario is None else _where(scenario)
            assert got == _expected_one_ahead(count), (
                f"{where}, {count} batches: expected the events {_expected_one_ahead(count)}, got {got}. When the "
                "caller receives batch i, batch i+1 (and no more) must already have been taken from the loader, "
                "and nothing before iteration starts")


# ---------------------------------------------------------------- Prefetcher on a simulated GPU

COPY = 1.0 + 8 / 4096  # simulated seconds to copy one batch: 4096 bytes of x and 8 of y, at 4096 bytes per second


def _prefetch_simulated(module, n, compute, sync_each_step, as_dict, pinned):
    results = []
    for device, index, current, own_stream in SCENARIOS:
        with SimulatedGPU(modules=[module], devices=2) as gpu:
            batches = [(torch.full((1024,), float(i)), torch.tensor(i)) for i in range(n)]  # pageable, like a dataset's
            if pinned:  # as DataLoader(pin_memory=True) gives them, pinned in a background thread: no host time here
                batches = [(x.pin_memory(), y.pin_memory()) for x, y in batches]
                gpu.now = 0.0
            if as_dict:
                batches = [{"x": x, "y": y} for x, y in batches]
            seen = []
            with _caller_context(gpu, index, current, own_stream):
                before = _context_now(gpu)
                for i, batch in enumerate(module.Prefetcher(batches, device)):
                    x, y = (batch["x"], batch["y"]) if as_dict else batch
                    gpu.kernel(compute, reads=[x, y], name=f"the caller's work on batch {i}", device=index)
                    seen.append({"devices": [gpu.device_of(x), gpu.device_of(y)], "x": float(gpu.peek(x)[0]),
                                 "y": int(gpu.peek(y)), "type": type(batch).__name__})
                    if sync_each_step:
                        gpu.read_back(index)  # like logging loss.item() at every step
                    del batch, x, y
                kept = _context_now(gpu) == before
            results.append({"seen": seen, "total": gpu.finish(), "problems": gpu.problems, "waits": gpu.host_waits,
                            "context kept": kept})
    return results


def _check_batches(scenario, result, n, as_dict):
    where, index = _where(scenario), scenario[1]
    assert len(result["seen"]) == n, f"{where}: {n} batches in, {len(result['seen'])} out"
    for i, batch in enumerate(result["seen"]):
        assert batch["devices"] == [index, index], (
            f"{where}: batch {i}'s tensors are on {['cpu' if d is None else f'cuda:{d}' for d in batch['devices']]}, "
            f"not cuda:{index}. Copy to the prefetcher's device, with a side stream of that device")
        assert (batch["x"], batch["y"]) == (float(i), i), f"{where}: batch {i} came out of order or changed: {batch}"
        assert batch["type"] == ("dict" if as_dict else "tuple"), f"{where}: keep the batch's structure"
    assert result["context kept"], f"{where}: iterating changed the caller's current device or stream"


@pytest.mark.points(3)
def test_prefetcher_on_a_simulated_gpu_is_race_free_and_memory_safe():
    # The caller's work is three times longer than a copy and the host never waits: freed memory comes back fast.
    # Pinned batches (from DataLoader(pin_memory=True)) leave the host nothing to do between copies, so a missing
    # wait shows at once; pageable ones make the prefetcher pin them (host time), and the caller's work piles up.
    for as_dict, pinned in [(False, True), (True, True), (False, False)]:
        for scenario, result in zip(SCENARIOS, run("ex02", _prefetch_simulated, 6, 3 * COPY, False, as_dict, pinned)):
            _check_batches(scenario, result, 6, as_dict)
            assert not result["problems"], "\n".join(
                [f"{_where(scenario)}, on the simulated GPU:", *result["problems"][:4],
                 "(a read before its copy ends needs the caller's stream, the current stream of the prefetcher's "
                 "device, to wait on the copy's stream; a reuse of memory still being read needs record_stream on "
                 "the stream that reads it)"])


@pytest.mark.points(2)
def test_prefetcher_on_a_simulated_gpu_overlaps_copies_with_compute():
    # The caller reads a result back at every step (as loss.item() does), so only a copy started one batch
    # ahead, on its own stream, without the host waiting, can run while the caller computes. Batches come pinned
    # (perfect overlap is then possible) or pageable (the prefetcher pins them: host time, but no waiting).
    n = 6
    for compute in (2 * COPY, COPY / 2):
        for pinned in (True, False):
            results = run("ex02", _prefetch_simulated, n, compute, True, False, pinned)
            for scenario, result in zip(SCENARIOS, results):
                where = f"{_where(scenario)}, {'pinned' if pinned else 'pageable'} batches"
                _check_batches(scenario, result, n, False)
                assert not result["waits"], (
                    f"{where}: handing out batches made the host wait for the GPU: {sorted(set(result['waits']))}. "
                    "Copy from pinned memory with non_blocking=True, and let the caller's stream wait instead of "
                    "the host")
                assert not result["problems"], "\n".join([where, *result["problems"][:4]])
                if pinned:
                    best, serial = _schedule(n, COPY, compute, True), _schedule(n, COPY, compute, False)
                    assert math.isclose(result["total"], best, rel_tol=1e-9), (
                        f"{where}: copy {COPY:.4g} s and compute {compute:.4g} s per batch: perfect overlap takes "
                        f"{best:.4g} s, one after the other {serial:.4g} s; your prefetcher took "
                        f"{result['total']:.4g} s. Is each copy on a side stream of the prefetcher's device, started "
                        "one batch ahead, and does the caller's stream wait only for the batch it gets?")


def _prefetch_any_batches(module, passes, scenario):
    device, index, current, own_stream = scenario
    with SimulatedGPU(modules=[module], devices=2) as gpu:
        before = _picture(passes)
        prefetcher = module.Prefetcher(_Loader(passes, []), device)
        got, same = [], []
        with _caller_context(gpu, index, current, own_stream):
            for k in range(2):
                got.append([])
                for batch, given in zip(prefetcher, passes[k] + [None] * 8):
                    tensors = []
                    got[-1].append(_picture(batch, lambda t: tensors.append(t) or {"tensor": [
                        "cpu" if gpu.device_of(t) is None else f"cuda:{gpu.device_of(t)}", str(t.dtype),
                        list(t.shape), gpu.peek(t).tolist()]}))
                    gpu.kernel(0.5, reads=tensors, name=f"the caller's work on pass {k}", device=index)
                    same.append(_postconditions(_picture(given), given, batch)["same objects"])
                    del batch, tensors
        return {"passes": got, "problems": gpu.problems, "waits": gpu.host_waits, "same objects": all(same),
                "unchanged": _picture(passes) == before}


@st.composite
def _two_passes(draw):
    n = draw(st.integers(0, 4))
    return [draw(st.lists(_BATCHES, min_size=n, max_size=n)) for _ in range(2)]


@pytest.mark.points(2)
@settings(max_examples=8)
@given(passes=_two_passes())
@example(passes=[[(torch.ones(2), 1)], [(torch.zeros(2), 2)]])  # run first: a stub fails here, without shrinking
def test_prefetcher_moves_any_batches_to_any_device(passes):
    # Batches of any structure (mappings of every kind, lists in dicts, None), two passes that differ, on cuda:1
    # while cuda:0 is current and the caller iterates on its own stream.
    scenario = SCENARIOS[3]
    got = run("ex02", _prefetch_any_batches, passes, scenario)
    for number, (one_pass, batches) in enumerate(zip(got["passes"], passes), 1):
        want = [_picture(b, _picture_on("cuda:1", True)) for b in batches]
        assert len(one_pass) == len(want), (
            f"{_where(scenario)}, pass {number}: the loader gave {len(want)} batches, the prefetcher {len(one_pass)}")
        for i, (a, b) in enumerate(zip(one_pass, want)):
            assert a == b, f"{_where(scenario)}, pass {number}, batch {i}: expected {b}, got {a}"
    assert not got["problems"], "\n".join([_where(scenario), *got["problems"][:4]])
    assert not got["waits"], f"{_where(scenario)}: the host waited for the GPU: {sorted(set(got['waits']))}"
    assert got["same objects"], (
        "values other than tensors (None, numbers, strings, objects) must be handed out as they are")
    assert got["unchanged"], "the prefetcher changed the loader's batches: move copies, leave the batches alone"


def _prefetch_real_gpu(module):
    device = torch.device("cuda", 0)
    n, numel = 12, 16 * 2**20  # 64 MiB of float32 per batch
    batches = [torch.full((numel,), float(i)).pin_memory() for i in range(n)]  # as DataLoader(pin_memory=True)
    weights = torch.randn(4096, 4096, device=device)

    def step(x, i):
        weights @ weights  # the caller's compute, about twice as long as a copy on an H100
        return bool(torch.equal(x, torch.full_like(x, float(i))))  # reads back every step, like loss.item()

    def plain():
        return [step(x.to(device), i) for i, x in enumerate(batches)]

    def prefetched():
        return [step(x, i) for i, x in enumerate(module.Prefetcher(batches, device))]

    for _ in range(2):  # warm up both
        plain(), prefetched()
    timings = {}
    for name, loop in [("plain", plain), ("prefetched", prefetched)] * 3:
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        ok = loop()
        end.record()
        end.synchronize()
        timings.setdefault(name, []).append(start.elapsed_time(end))
        timings.setdefault(name + " ok", []).append(all(ok))
    return {k: v for k, v in timings.items()}


@pytest.mark.gpu(1)
@pytest.mark.points(2)
def test_prefetcher_on_a_real_gpu():
    result = run("ex02", _prefetch_real_gpu, timeout=300)
    assert all(result["prefetched ok"]), "a batch reached the caller's stream before its copy was complete"
    plain, prefetched = min(result["plain"]), min(result["prefetched"])
    assert prefetched <= 0.9 * plain, (
        f"12 batches of 64 MiB with a matmul each: {plain:.1f} ms copying in the loop, {prefetched:.1f} ms with your "
        "prefetcher; copies on a side stream should hide behind the matmuls")


# ---------------------------------------------------------------- mean_loss


class _Recorder(nn.Module):
    """A small classifier that notes whether autograd was recording during each forward; on the simulated GPU its
    forward also takes device time, as a real one does."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
        self.grad_enabled = []

    def forward(self, x):
        self.grad_enabled.append(torch.is_grad_enabled())
        if SimulatedGPU._active is not None:
            SimulatedGPU._active.kernel(0.25, reads=[x], name="the model's forward")
        return self.layers(x)


def _loss_inputs(device="cpu"):
    torch.manual_seed(0)
    model = _Recorder().to(device)
    batches = [(torch.randn(size, 5, device=device), torch.randint(0, 3, (size,), device=device))
               for size in (8, 8, 8, 3)]  # the last batch is smaller: the mean is over batches, not samples
    return model, batches


READS = ["item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "__repr__", "__str__",
         "__format__"]


def _count_reads(module):
    model, batches = _loss_inputs()
    reads, depth, saved = [], [0], {}

    def counting(name, original):
        def wrapper(self, *args, **kwargs):
            if depth[0] == 0:
                reads.append(name)
            depth[0] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                depth[0] -= 1
        return wrapper

    for name in READS:
        saved[name] = (name in vars(torch.Tensor), getattr(torch.Tensor, name))
        setattr(torch.Tensor, name, counting(name, saved[name][1]))
    try:
        value = module.mean_loss(model, batches)
    finally:
        for name, (present, original) in saved.items():
            if present:
                setattr(torch.Tensor, name, original)
            else:
                delattr(torch.Tensor, name)
    return {"reads": reads, "type": type(value).__name__}


@pytest.mark.points(2)
def test_mean_loss_reads_the_device_once():
    got = run("ex02", _count_reads)
    assert got["type"] == "float", f"return a Python float, not a {got['type']}"
    assert len(got["reads"]) == 1, (
        f"the host read tensor values {len(got['reads'])} times ({', '.join(got['reads'][:6])}...) for 4 batches; "
        "on a GPU each read waits for the device. Keep the total on the device and read it once, at the end")


def _mean_loss_value(module):
    model, batches = _loss_inputs()
    before = copy.deepcopy(batches), copy.deepcopy(model.state_dict())
    value = module.mean_loss(model, batches)
    unchanged = (all(torch.equal(a, b) for pair, given in zip(before[0], batches) for a, b in zip(pair, given))
                 and all(torch.equal(before[1][k], v) for k, v in model.state_dict().items()))
    return {"value": float(value), "type": type(value).__name__, "grad_enabled": model.grad_enabled,
            "unchanged": unchanged}


def _slow_mean_loss():
    model, batches = _loss_inputs()
    with torch.no_grad():
        return sum(nn.functional.cross_entropy(model(x), y).item() for x, y in batches) / len(batches)


@pytest.mark.points(2)
def test_mean_loss_matches_the_slow_version_without_gradients():
    got = run("ex02", _mean_loss_value)
    want = _slow_mean_loss()
    assert math.isclose(got["value"], want, rel_tol=1e-5), (
        f"the mean of the 4 per-batch losses is {want:.6f}; you returned {got['value']:.6f} (a mean over batches, "
        "not over samples: the last batch is smaller)")
    assert got["type"] == "float", f"return a Python float, not a {got['type']}"
    assert got["grad_enabled"] and not any(got["grad_enabled"]), (
        "run the model under torch.no_grad(): with autograd on, every loss keeps its graph alive")
    assert got["unchanged"], "mean_loss changed the batches or the model's parameters"


def _mean_loss_simulated(module, scenarios):
    results = []
    for index, current, own_stream in scenarios:
        with SimulatedGPU(modules=[module], devices=2) as gpu:
            model, batches = _loss_inputs()
            model.to(f"cuda:{index}")
            batches = [(x.to(f"cuda:{index}"), y.to(f"cuda:{index}")) for x, y in batches]
            before = [gpu.peek(t) for pair in batches for t in pair]
            waits = len(gpu.host_waits)
            result = {"error": None, "type": None, "value": None}
            with _caller_context(gpu, index, current, own_stream):
                context = _context_now(gpu)
                try:
                    value = module.mean_loss(model, batches)
                    result.update(type=type(value).__name__,
                                  value=value if type(value) in (float, int) else None)
                except NotImplementedError:
                    raise
                except Exception as exc:  # noqa: BLE001 - e.g. tensors of two devices in one op
                    result["error"] = f"{type(exc).__name__}: {exc}"
                result["context kept"] = _context_now(gpu) == context
            result.update(waits=gpu.host_waits[waits:], problems=gpu.problems,
                          unchanged=all(torch.equal(a, gpu.peek(t)) for a, t in
                                        zip(before, [t for pair in batches for t in pair])))
            results.append(result)
    return results


LOSS_SCENARIOS = [(0, 0, False), (1, 0, False), (1, 0, True), (0, 1, True)]


@pytest.mark.points(2)
def test_mean_loss_on_a_simulated_gpu_reads_once_on_any_device():
    # The model and batches on cuda:1 while cuda:0 is current (and the other way), the caller on its own stream:
    # the total must live on the batches' device, and the one read must wait for it.
    want = _slow_mean_loss()
    for (index, current, own_stream), got in zip(LOSS_SCENARIOS, run("ex02", _mean_loss_simulated, LOSS_SCENARIOS)):
        where = (f"model and batches on cuda:{index}, cuda:{current} current"
                 + (", the caller on its own stream" if own_stream else ""))
        assert got["error"] is None, (
            f"{where}: mean_loss raised {got['error']}. Keep the running total on the batches' device (the model's "
            "output's), not on the current device or the CPU")
        assert got["type"] == "float", f"{where}: return a Python float, not a {got['type']}"
        assert math.isclose(got["value"], want, rel_tol=1e-5), f"{where}: expected {want:.6f}, got {got['value']:.6f}"
        assert not got["problems"], "\n".join(
            [f"{where}:", *got["problems"][:3], "a non-blocking copy to the host returns before its values are "
             "there: read the device tensor itself (.item() waits for it)"])
        assert len(got["waits"]) == 1, (
            f"{where}: the host waited for the device {len(got['waits'])} times ({got['waits'][:4]}): read the total "
            "once, at the end")
        assert got["context kept"] and got["unchanged"], f"{where}: mean_loss changed its inputs, the device or stream"


def _empty_loss(module):
    model, _ = _loss_inputs()
    return exception_raised_by(module.mean_loss, model, [])


@pytest.mark.points(1)
def test_mean_loss_rejects_no_batches():
    kind, _ = run("ex02", _empty_loss)
    assert kind == "ValueError", f"an empty list of batches needs a ValueError, got {kind}"


def _syncs_on_real_gpu(module):
    import warnings

    model, batches = _loss_inputs("cuda")

    def one_read():  # the test's own version: the total stays on the device, one .item() at the end
        with torch.no_grad():
            total = sum(nn.functional.cross_entropy(model(x), y) for x, y in batches)
            return (total / len(batches)).item()

    def synchronisations(fn):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")  # warn at every call that makes the host wait for the GPU
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return sum("synchronizing" in str(w.message) for w in caught)

    return {"yours": synchronisations(lambda: module.mean_loss(model, batches)), "one read": synchronisations(one_read)}


@pytest.mark.gpu(1)
@pytest.mark.points(1)
def test_mean_loss_synchronises_once_on_a_real_gpu():
    got = run("ex02", _syncs_on_real_gpu)
    assert got["yours"] <= got["one read"], (
        f"torch.cuda.set_sync_debug_mode counted {got['yours']} synchronisations in your mean_loss, "
        f"{got['one read']} in a version that reads the total once")
