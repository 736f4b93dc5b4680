"""The simulated GPU that grades exercise 02 without a GPU follows the rules it claims (the docstring of
course_lib/grading/simgpu/__init__.py).

Each scenario runs in a child process, as the graded tests' drivers do: the simulation patches torch and time
for a whole process, and refuses to start in this one.
"""

from __future__ import annotations

import sys
import time

import cloudpickle
import pytest
import torch

from course_lib.dist.launcher import RankJob, run_ranks
from course_lib.grading.simgpu import SimulatedGPU

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the child cannot import this test module


def in_child(scenario, *args):
    """scenario(*args) in a fresh child process; its result, as plain data."""
    job = RankJob(lambda rank, world_size, *a: scenario(*a), 1, args, init_process_group=False, timeout=60,
                  quiet=True, prefix_output=False, plain_results=True)
    return run_ranks(job)[0]


def test_it_refuses_to_patch_the_test_process():
    with pytest.raises(RuntimeError, match="child process"):
        SimulatedGPU().__enter__()
    assert not torch.cuda.is_available() or torch.cuda.get_device_name(0) != "simulated GPU"


def _restored():
    import types

    learner = types.ModuleType("learner")
    learner.perf_counter = time.perf_counter  # as `from time import perf_counter` leaves it
    before = [torch.cuda.Stream, torch.cuda.synchronize, torch.Tensor.to, torch.Tensor.record_stream,
              time.perf_counter, learner.perf_counter]
    with SimulatedGPU(modules=[learner]) as gpu:
        inside = {"available": torch.cuda.is_available(), "learner's clock": learner.perf_counter is time.perf_counter,
                  "to replaced": torch.Tensor.to is not before[2]}
        gpu.host_work(2.0)
        inside["clock"] = learner.perf_counter()
    after = [torch.cuda.Stream, torch.cuda.synchronize, torch.Tensor.to, torch.Tensor.record_stream,
             time.perf_counter, learner.perf_counter]
    return {**inside, "restored": all(a is b for a, b in zip(before, after)), "to shadowed": "to" in vars(torch.Tensor)}


def test_everything_is_restored_on_exit():
    got = in_child(_restored)
    assert got["available"] and got["to replaced"] and got["learner's clock"]
    assert got["clock"] == 2.0, "a clock imported by name reads the simulated host clock"
    assert got["restored"], "every replaced function is put back"
    assert not got["to shadowed"], "an inherited method must not be left shadowed on torch.Tensor"


def _launch_and_synchronize():
    with SimulatedGPU() as gpu:
        t0 = time.perf_counter()
        gpu.kernel(0.5)
        launched = time.perf_counter() - t0
        torch.cuda.synchronize()
        return [launched, time.perf_counter() - t0, gpu.host_waits]


def test_a_launch_returns_at_once_and_synchronize_waits():  # CUDA semantics: asynchronous execution
    launched, synchronised, waits = in_child(_launch_and_synchronize)
    assert launched == 0.0 and synchronised == pytest.approx(0.5) and waits == ["torch.cuda.synchronize()"]


def _events():
    with SimulatedGPU() as gpu:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        gpu.kernel(1.0)
        start.record()
        gpu.kernel(0.25)
        end.record()
        errors = []
        for first, second in [(start, end), (torch.cuda.Event(), end), (torch.cuda.Event(enable_timing=True), end)]:
            try:
                first.elapsed_time(second)
                errors.append("returned")
            except (RuntimeError, ValueError) as error:
                errors.append(f"{type(error).__name__}: {error}")
        end.synchronize()
        return {"errors": errors, "ms": start.elapsed_time(end), "now": gpu.now}


def test_events_time_the_stream_in_milliseconds_and_refuse_early_reads():  # c10/cuda/CUDAEvent.h
    got = in_child(_events)
    assert got["errors"] == ["RuntimeError: Both events must be completed before calculating elapsed time.",
                             "ValueError: Both events must be created with argument 'enable_timing=True'.",
                             "ValueError: Both events must be recorded before calculating elapsed time."]
    assert got["ms"] == pytest.approx(250.0) and got["now"] == pytest.approx(1.25)


def _wait_stream():
    with SimulatedGPU() as gpu:
        side = torch.cuda.Stream()
        pinned = torch.ones(4096).pin_memory()  # pinning costs host time: done before the device work starts
        gpu.now = 0.0
        with torch.cuda.stream(side):
            gpu.kernel(1.0, name="first")
        torch.cuda.current_stream().wait_stream(side)
        with side:
            pinned.to("cuda", non_blocking=True)  # a 4 s copy queued after the wait
        return gpu.kernel(1.0, name="default").start


def test_wait_stream_waits_for_the_work_queued_so_far_only():  # torch/cuda/streams.py: wait_stream
    assert in_child(_wait_stream) == pytest.approx(1.0), "wait for 'first' (queued before the wait), not the copy"


def _race(wait):
    with SimulatedGPU() as gpu:
        side = torch.cuda.Stream()
        source = torch.ones(4096).pin_memory()
        with torch.cuda.stream(side):
            x = source.to("cuda", non_blocking=True)
        if wait:
            torch.cuda.current_stream().wait_stream(side)
        gpu.kernel(0.1, reads=[x])
        return gpu.problems


@pytest.mark.parametrize("wait", [False, True])
def test_a_read_before_its_copy_ends_is_a_race(wait):  # CUDA semantics: CUDA streams
    problems = in_child(_race, wait)
    assert bool(problems) is not wait and all(p.startswith("race") for p in problems)


def _host_waits():
    with SimulatedGPU() as gpu:
        torch.ones(4096).pin_memory().to("cuda", non_blocking=True)
        torch.ones(4096).pin_memory().cuda(non_blocking=True)
        quiet = list(gpu.host_waits)
        torch.ones(4096).to("cuda", non_blocking=True)  # pageable
        torch.ones(4096).pin_memory().to(torch.device("cuda", 0))  # non_blocking=False
        return [quiet, gpu.host_waits]


def test_pageable_or_blocking_copies_make_the_host_wait():  # Copy.cu, CUDA runtime API synchronization behavior
    quiet, waits = in_child(_host_waits)
    assert quiet == [] and waits == ["a copy from pageable memory (not pinned)", "a blocking copy (non_blocking=False)"]


def _reuse(record):
    with SimulatedGPU() as gpu:
        reader = torch.cuda.Stream()
        x = torch.ones(4096).pin_memory().to("cuda", non_blocking=True)  # allocated on the default stream
        reader.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(reader):
            gpu.kernel(10.0, reads=[x], name="a long read on another stream")
        if record:
            x.record_stream(reader)
        del x
        torch.ones(4096).pin_memory().to("cuda", non_blocking=True)  # same size, same stream
        return gpu.problems


@pytest.mark.parametrize("record", [False, True])
def test_record_stream_keeps_freed_memory_from_being_reused_too_early(record):  # Tensor.record_stream's docstring
    problems = in_child(_reuse, record)
    assert bool(problems) is not record and all(p.startswith("use after free") for p in problems)


# ---------------------------------------------------------------- several devices


def _devices():
    with SimulatedGPU(devices=3) as gpu:
        got = {"count": torch.cuda.device_count(), "current": torch.cuda.current_device()}
        with torch.cuda.device(2):
            got["inside device(2)"] = torch.cuda.current_device()
            got["stream of the current device"] = torch.cuda.current_stream().device.index
        got["after"] = torch.cuda.current_device()
        side = torch.cuda.Stream(1)
        got["Stream(1).device"] = str(side.device)
        with torch.cuda.stream(side):  # makes side's device current, and side its current stream
            got["inside stream(side)"] = [torch.cuda.current_device(), torch.cuda.current_stream(1) is side,
                                          torch.cuda.current_stream(0) is gpu.devices[0].default]
        got["after stream(side)"] = [torch.cuda.current_device(),
                                     torch.cuda.current_stream(1) is gpu.devices[1].default]
        torch.cuda.set_device(1)
        got["set_device(1)"] = torch.cuda.current_device()
        torch.cuda.set_device(0)
        try:
            torch.cuda.Stream(3)
            got["Stream(3)"] = "created"
        except RuntimeError as error:
            got["Stream(3)"] = str(error).split(" (")[0]
        return got


def test_devices_and_the_current_device():  # torch/cuda/__init__.py: device, StreamContext, set_stream
    got = in_child(_devices)
    assert got == {"count": 3, "current": 0, "inside device(2)": 2, "stream of the current device": 2, "after": 0,
                   "Stream(1).device": "cuda:1", "inside stream(side)": [1, True, True],
                   "after stream(side)": [0, True], "set_device(1)": 1,
                   "Stream(3)": "CUDA error: invalid device ordinal"}


def _copies_land_on_their_device():
    with SimulatedGPU(devices=2) as gpu:
        source = torch.ones(1024).pin_memory()
        gpu.now = 0.0
        on_one = source.to("cuda:1", non_blocking=True)  # device 0 is current
        on_current = source.to("cuda", non_blocking=True)
        with torch.cuda.device(1):
            cuda_call = source.cuda(non_blocking=True)
        spans = [[s.device, s.stream, s.start] for s in gpu.spans]
        return {"devices": [gpu.device_of(t) for t in (on_one, on_current, cuda_call)],
                "reported": [str(t.device) for t in (on_one, on_current, cuda_call)], "spans": spans,
                "host": gpu.device_of(source), "waits": gpu.host_waits}


def test_a_copy_lands_on_the_device_it_names_with_its_own_engines():  # Copy.cu: the destination's current stream
    got = in_child(_copies_land_on_their_device)
    assert got["devices"] == [1, 0, 1] and got["reported"] == ["cuda:1", "cuda:0", "cuda:1"] and got["host"] is None
    # each device has its own copy engine: the copies to cuda:1 and cuda:0 both start at once; the second copy to
    # cuda:1 waits for the first (same stream, same engine). Default streams: 0 on cuda:0, 1 on cuda:1.
    assert got["spans"] == [[1, 1, 0.0], [0, 0, 0.0], [1, 1, 1.0]] and got["waits"] == []


def _synchronize_one_device():
    with SimulatedGPU(devices=2) as gpu:
        gpu.kernel(1.0, device=0)
        gpu.kernel(5.0, device=1)
        torch.cuda.synchronize()  # the current device, 0
        first = gpu.now
        torch.cuda.synchronize(1)
        return [first, gpu.now, gpu.host_waits]


def test_synchronize_waits_for_one_device_only():  # torch/cuda/__init__.py: synchronize(device)
    first, second, waits = in_child(_synchronize_one_device)
    assert (first, second) == (1.0, 5.0) and waits == ["torch.cuda.synchronize()", "torch.cuda.synchronize(1)"]


def _events_across_devices():
    with SimulatedGPU(devices=2) as gpu:
        got = {}
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()  # the current stream of the current device: cuda:0
        gpu.kernel(2.0, device=1)
        end.record(torch.cuda.current_stream(1))
        torch.cuda.synchronize(1)
        try:
            start.elapsed_time(end)
            got["elapsed"] = "returned"
        except RuntimeError as error:
            got["elapsed"] = str(error).split(" (")[0]
        try:
            start.record(torch.cuda.current_stream(1))
            got["record"] = "recorded"
        except RuntimeError as error:
            got["record"] = str(error)
        on_one = torch.cuda.Stream(1)
        with torch.cuda.stream(on_one):
            gpu.kernel(3.0)
        torch.cuda.current_stream(0).wait_stream(on_one)  # a cross-device wait is allowed
        got["device 0 kernel starts"] = gpu.kernel(1.0, device=0).start
        return got


def test_events_belong_to_a_device_and_streams_wait_across_devices():  # CUDAEvent.h; CUDA guide 6.2.9.3
    got = in_child(_events_across_devices)
    assert got == {"elapsed": "CUDA error: invalid resource handle",
                   "record": "Event device 0 does not match recording stream's device 1.",
                   "device 0 kernel starts": 5.0}


def _ops_follow_their_device():
    with SimulatedGPU(devices=2) as gpu:
        a = torch.ones(4).pin_memory().to("cuda:1", non_blocking=True)
        b = torch.ones(4).pin_memory().to("cuda:0", non_blocking=True)
        got = {"a + a": gpu.device_of(a + a), "zeros": gpu.device_of(torch.zeros(2, device="cuda:1")),
               "view": gpu.device_of(a[1:])}
        for name, op in [("a + b", lambda: a + b), ("cpu += a", lambda: torch.zeros(4).add_(a)),
                         ("numpy", lambda: a.numpy())]:
            try:
                op()
                got[name] = "ran"
            except (RuntimeError, TypeError) as error:
                got[name] = type(error).__name__ + ": " + str(error).split("!")[0].split(".")[0]
        got["scalar + a"] = gpu.device_of(torch.zeros(()) + a)  # a 0-d CPU operand is allowed
        before = list(gpu.host_waits)
        got["item"] = (a.sum() * 2).item()
        got["waits"] = gpu.host_waits[len(before):]
        return got


def test_ops_run_on_their_tensors_device_and_refuse_to_mix_devices():  # TensorIterator's device check
    got = in_child(_ops_follow_their_device)
    assert got["a + a"] == 1 and got["zeros"] == 1 and got["view"] == 1 and got["scalar + a"] == 1
    assert got["a + b"] == "RuntimeError: Expected all tensors to be on the same device, but found at least two " \
                           "devices, cuda:0 and cuda:1"
    assert got["cpu += a"].startswith("RuntimeError: Expected all tensors to be on the same device")
    assert got["numpy"] == "TypeError: can't convert cuda:1 device type tensor to numpy"
    assert got["item"] == 8.0 and got["waits"] == ["Tensor.item() reads a device tensor"]


def _non_blocking_read(wait):
    with SimulatedGPU(devices=2) as gpu:
        x = torch.ones(1024).pin_memory().to("cuda:1", non_blocking=True)
        gpu.kernel(1.0, reads=[x])
        on_host = x.sum().to("cpu", non_blocking=True)  # returns at once, before the copy has run
        queued_at = gpu.now
        if wait:
            torch.cuda.synchronize(1)
        value = float(on_host)
        return {"value": value, "queued_at": queued_at, "problems": gpu.problems, "pinned": on_host.is_pinned()}


@pytest.mark.parametrize("wait", [False, True])
def test_a_non_blocking_copy_to_the_host_is_not_ready_until_its_stream_gets_there(wait):  # pinmem_nonblock tutorial
    got = in_child(_non_blocking_read, wait)
    assert got["value"] == 1024.0 and got["pinned"]
    assert bool(got["problems"]) is not wait and all(p.startswith("read before ready") for p in got["problems"])


def _pinning():
    with SimulatedGPU(bytes_per_second=4096.0) as gpu:
        pinned = torch.ones(1024).pin_memory()  # 4096 bytes
        after_one = gpu.now
        pinned.pin_memory()  # already pinned: free
        return [after_one, gpu.now]


def test_pinning_costs_host_time():  # the pinmem_nonblock tutorial: pin_memory() copies every byte
    assert in_child(_pinning) == [1.0, 1.0]


def _device_to_device():
    with SimulatedGPU(devices=2) as gpu:
        x = torch.ones(1024).pin_memory().to("cuda:1", non_blocking=True)  # copy 0..1 s on cuda:1
        gpu.now = 0.0  # (pinning took host time; the device work starts at 0 here)
        gpu.kernel(2.0, device=0, name="busy cuda:0")  # cuda:0's current stream is busy until 2 s
        moved = x.to("cuda:0")  # a gather onto cuda:0
        copy_span = gpu.spans[-1]
        after = gpu.kernel(1.0, reads=[moved], name="reads the gathered tensor")
        return {"device": gpu.device_of(moved), "copy": [copy_span.device, copy_span.start, copy_span.end],
                "reader": [after.device, after.start], "same": gpu.device_of(x.to("cuda:1")) == 1,
                "problems": gpu.problems}


def test_a_copy_between_devices_orders_both_devices_streams():  # Copy.cu: copy_device_to_device's two-way barrier
    got = in_child(_device_to_device)
    # queued on the source's (cuda:1's) stream, after cuda:0's current stream's work (2 s); cuda:0 then waits for it
    assert got["device"] == 0 and got["copy"] == [1, 2.0, 3.0] and got["reader"] == [0, 3.0]
    assert got["same"] and got["problems"] == []
