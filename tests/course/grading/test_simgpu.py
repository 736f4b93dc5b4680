"""The simulated GPU that grades exercise 02 without a GPU follows the rules it claims (course_lib/grading/simgpu.py).

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
        with torch.cuda.stream(side):
            gpu.kernel(1.0, name="first")
        torch.cuda.current_stream().wait_stream(side)
        with side:
            torch.ones(4096).pin_memory().to("cuda", non_blocking=True)  # a 4 s copy queued after the wait
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
