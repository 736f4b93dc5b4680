"""Graded tests for exercise 02: streams and asynchronous execution.

Each test reaches the learner's code through `run`, in a child process, and gets plain data back. The CUDA
parts are graded on any machine against a simulated GPU (course_lib.grading.simgpu: a model of streams,
events, copies and the caching allocator, installed in the child while the learner's code runs, never in
this process); tests marked gpu(1) also run them on a real GPU. References are computed here, independently
of the code graded.
"""

from __future__ import annotations

import collections
import contextlib
import math
import statistics

import pytest
import torch
from torch import nn

from course_lib.grading import exception_raised_by, run
from course_lib.grading.simgpu import SimulatedGPU

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
            results.append({"times": [float(t) for t in times], "calls": len(calls)})
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
        assert len(result["times"]) == repeat, f"return {repeat} durations, one per timed call"
        assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(result["times"], expected)), (
            f"warmup={warmup}: the timed calls took {expected} s; your timer returned {result['times']}")
    assert len(got["real"]) == 2 and all(t >= 0 for t in got["real"])


def _time_on_simulated_gpu(module, devices):
    results = []
    for device in devices:
        with SimulatedGPU(modules=[module]) as gpu:
            durations, calls = _durations(3 + 4), []

            def fn():  # queues a kernel and returns at once, as a real launch does
                gpu.kernel(durations[len(calls)], name=f"call {len(calls)}")
                calls.append(1)

            try:
                times = [float(t) for t in module.time_device(fn, device, warmup=3, repeat=4)]
                results.append({"times": times, "calls": len(calls), "error": None})
            except NotImplementedError:
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. reading an event before the GPU reached it
                results.append({"times": [], "calls": len(calls), "error": f"{type(exc).__name__}: {exc}"})
    return results


GPU_DEVICES = ["cuda", "cuda:0", torch.device("cuda", 0)]


@pytest.mark.points(3)
def test_time_device_times_queued_gpu_work_on_a_simulated_gpu():
    expected = _durations(7)[3:]
    for device, result in zip(GPU_DEVICES, run("ex02", _time_on_simulated_gpu, GPU_DEVICES)):
        assert result["error"] is None, f"device {device!r}: {result['error']}"
        assert result["calls"] == 7, f"device {device!r}: fn must be called warmup + repeat = 7 times"
        assert len(result["times"]) == 4
        times = result["times"]
        if all(t < 1e-9 for t in times):
            raise AssertionError(f"device {device!r}: every time is 0 s: the host measured how long it took to "
                                 "*queue* the work. Time GPU work with CUDA events, or synchronize")
        assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(times, expected)), (
            f"device {device!r}: the kernels took {expected} s on the (simulated) GPU; your timer returned "
            f"{times}. Seconds, not milliseconds; and did earlier work still in the queue end up in a timing?")


def _bad_timer_arguments(module):
    return [exception_raised_by(module.time_device, 3, "cpu"),
            exception_raised_by(module.time_device, lambda: None, "cpu", warmup=-1),
            exception_raised_by(module.time_device, lambda: None, "cpu", repeat=0)]


@pytest.mark.points(1)
def test_time_device_rejects_bad_arguments():
    kinds = [kind for kind, _ in run("ex02", _bad_timer_arguments)]
    assert kinds == ["TypeError", "ValueError", "ValueError"], (
        f"expected TypeError for a non-callable fn and ValueError for warmup < 0 or repeat < 1, got {kinds}")


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
    return [[float(module.pipeline_time(n, c, k, overlapped=o)) for o in (False, True)] for n, c, k in cases]


@pytest.mark.points(3)
def test_pipeline_time_matches_the_schedule():
    for (n, c, k), (serial, overlapped) in zip(PIPELINES, run("ex02", _pipelines, PIPELINES)):
        for name, got, want in [("serial", serial, _schedule(n, c, k, False)),
                                ("overlapped", overlapped, _schedule(n, c, k, True))]:
            assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12), (
                f"{n} batches, copy {c}, compute {k}, {name}: the schedule takes {want:g}, you said {got:g}")


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
            for args in [(-1, 1.0, 1.0), (3, -0.5, 1.0), (3, 1.0, -2.0)]]


@pytest.mark.points(1)
def test_pipeline_time_rejects_bad_arguments():
    kinds = [kind for kind, _ in run("ex02", _bad_pipelines)]
    assert kinds == ["ValueError"] * 3, f"negative batches or times need a ValueError, got {kinds}"


# ---------------------------------------------------------------- Prefetcher on cpu and meta


Pair = collections.namedtuple("Pair", "image label")


class _Loader:
    """A loader that logs when each batch is taken from it, and has a length."""

    def __init__(self, batches, log):
        self.batches, self.log = batches, log

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for i, batch in enumerate(self.batches):
            self.log.append(f"loader gave {i}")
            yield batch


def _cpu_batches():
    return [
        {"x": torch.arange(6.0).reshape(2, 3), "y": torch.tensor([1, 0]), "name": "first"},
        (torch.ones(2, 2), torch.zeros(2, dtype=torch.int64)),
        [Pair(torch.full((3,), 7.0), 3), None, "text"],
        torch.arange(4),
    ]


def _describe(x, keep_values):
    if isinstance(x, torch.Tensor):
        out = {"tensor": x.device.type, "shape": list(x.shape), "dtype": str(x.dtype)}
        if keep_values and x.device.type == "cpu":
            out["values"] = x.tolist()
        return out
    if isinstance(x, dict):
        return {"dict": [[k, _describe(v, keep_values)] for k, v in x.items()]}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return {type(x).__name__: [_describe(v, keep_values) for v in x]}
    if isinstance(x, (list, tuple)):
        return {type(x).__name__: [_describe(v, keep_values) for v in x]}
    return {"value": repr(x)}


def _prefetch_cpu(module, device):
    log = []
    prefetcher = module.Prefetcher(_Loader(_cpu_batches(), log), device)
    passes = [[_describe(b, True) for b in prefetcher] for _ in range(2)]
    empty = list(module.Prefetcher(_Loader([], []), device))
    return {"passes": passes, "length": len(prefetcher), "empty": len(empty)}


@pytest.mark.points(2)
def test_prefetcher_yields_the_loader_batches_in_order():
    for device in ["cpu", "meta", torch.device("meta")]:
        kind = torch.device(device).type
        want = [_describe(b, True) for b in _cpu_batches()]
        if kind == "meta":
            want = [_meta_description(w) for w in want]
        got = run("ex02", _prefetch_cpu, device)
        for number, one_pass in enumerate(got["passes"], 1):
            assert len(one_pass) == len(want), (
                f"device {device!r}, pass {number}: the loader has {len(want)} batches, the prefetcher gave "
                f"{len(one_pass)}")
            for i, (a, b) in enumerate(zip(one_pass, want)):
                assert a == b, f"device {device!r}, pass {number}, batch {i}: expected {b}, got {a}"
        assert got["length"] == 4, "len(prefetcher) must be len(loader)"
        assert got["empty"] == 0, "an empty loader gives no batches"


def _meta_description(description):
    """A description of the same batch with every tensor on the meta device (no values)."""
    if isinstance(description, dict):
        if "tensor" in description:
            return {"tensor": "meta", "shape": description["shape"], "dtype": description["dtype"]}
        return {key: _meta_description(value) for key, value in description.items()}
    if isinstance(description, list):
        return [_meta_description(value) for value in description]
    return description


def _one_ahead(module, count, simulated):
    log = []
    loader = _Loader([torch.full((4,), float(i)) for i in range(count)], log)
    with SimulatedGPU(modules=[module]) if simulated else contextlib.nullcontext():
        prefetcher = module.Prefetcher(loader, "cuda" if simulated else "cpu")
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
    for simulated in (False, True):
        for count in (4, 1, 0):
            got = run("ex02", _one_ahead, count, simulated)
            where = "on a simulated GPU" if simulated else "on the cpu"
            assert got == _expected_one_ahead(count), (
                f"{where}, {count} batches: expected the events {_expected_one_ahead(count)}, got {got}. When the "
                "caller receives batch i, batch i+1 (and no more) must already have been taken from the loader, "
                "and nothing before iteration starts")


# ---------------------------------------------------------------- Prefetcher on a simulated GPU

COPY = 1.0 + 8 / 4096  # simulated seconds to copy one batch: 4096 bytes of x and 8 of y, at 4096 bytes per second


def _prefetch_simulated(module, n, compute, sync_each_step, as_dict):
    with SimulatedGPU(modules=[module]) as gpu:
        batches = [(torch.full((1024,), float(i)), torch.tensor(i)) for i in range(n)]  # pageable, like a dataset's
        if as_dict:
            batches = [{"x": x, "y": y} for x, y in batches]
        seen = []
        for batch in module.Prefetcher(batches, torch.device("cuda", 0)):
            x, y = (batch["x"], batch["y"]) if as_dict else batch
            gpu.kernel(compute, reads=[x, y], name=f"the caller's work on batch {int(y)}")
            seen.append({"on_device": gpu.is_device_tensor(x) and gpu.is_device_tensor(y),
                         "x": float(x[0]), "y": int(y), "type": type(batch).__name__})
            if sync_each_step:
                gpu.read_back()  # like logging loss.item() at every step
            del batch, x, y
        return {"seen": seen, "total": gpu.finish(), "problems": gpu.problems, "waits": gpu.host_waits}


def _check_batches(result, n, as_dict):
    assert len(result["seen"]) == n, f"{n} batches in, {len(result['seen'])} out"
    for i, batch in enumerate(result["seen"]):
        assert batch["on_device"], f"batch {i} was not moved to the device"
        assert (batch["x"], batch["y"]) == (float(i), i), f"batch {i} came out of order or changed: {batch}"
        assert batch["type"] == ("dict" if as_dict else "tuple"), "keep the batch's structure"


@pytest.mark.points(3)
def test_prefetcher_on_a_simulated_gpu_is_race_free_and_memory_safe():
    # The caller's work is three times longer than a copy and the host never waits: freed memory comes back fast.
    for as_dict in (False, True):
        result = run("ex02", _prefetch_simulated, 6, 3 * COPY, False, as_dict)
        _check_batches(result, 6, as_dict)
        assert not result["problems"], "\n".join(
            ["on the simulated GPU:", *result["problems"][:4],
             "(a read before its copy ends needs a wait on the copy's stream; a reuse of memory still being read "
             "needs record_stream on the stream that reads it)"])


@pytest.mark.points(2)
def test_prefetcher_on_a_simulated_gpu_overlaps_copies_with_compute():
    # The caller reads a result back at every step (as loss.item() does), so only a copy started one batch
    # ahead, on its own stream, without the host waiting, can run while the caller computes.
    for compute in (2 * COPY, COPY / 2):
        n = 6
        result = run("ex02", _prefetch_simulated, n, compute, True, False)
        _check_batches(result, n, False)
        assert not result["waits"], (
            f"handing out batches made the host wait for the GPU: {sorted(set(result['waits']))}. Copy from "
            "pinned memory with non_blocking=True, and let the caller's stream wait instead of the host")
        best, serial = _schedule(n, COPY, compute, True), _schedule(n, COPY, compute, False)
        assert math.isclose(result["total"], best, rel_tol=1e-9), (
            f"copy {COPY:.4g} s and compute {compute:.4g} s per batch: perfect overlap takes {best:.4g} s, one "
            f"after the other {serial:.4g} s; your prefetcher took {result['total']:.4g} s. Is each copy on a side "
            "stream, started one batch ahead, and does the caller's stream wait only for the batch it gets?")
        assert not result["problems"], "\n".join(result["problems"][:4])


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
    """A small classifier that notes whether autograd was recording during each forward."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
        self.grad_enabled = []

    def forward(self, x):
        self.grad_enabled.append(torch.is_grad_enabled())
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
    value = module.mean_loss(model, batches)
    return {"value": float(value), "grad_enabled": model.grad_enabled}


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
    assert got["grad_enabled"] and not any(got["grad_enabled"]), (
        "run the model under torch.no_grad(): with autograd on, every loss keeps its graph alive")


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
