"""What the simulated machine's timeline is made of (exercise 02): devices with their engines, streams and events,
the spans of work that ran, and the device tensors and memory blocks the model follows.

A stream's work ends at its `done()` time; `wait_stream` and events hold back the work queued afterwards. The rules
and their sources are in the package's docstring (course_lib/grading/simgpu/__init__.py); the machine that queues
the work is course_lib/grading/simgpu/machine.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from course_lib.grading.simgpu.machine import SimulatedGPU

_EPS = 1e-12  # logical seconds: sums of floats that should be equal may differ by rounding


@dataclass(frozen=True)
class Span:
    """One piece of simulated device work: the stream it ran on, what it was, when (logical seconds), which device."""

    stream: int
    kind: str  # "copy" or "kernel"
    name: str
    start: float
    end: float
    device: int = 0


@dataclass
class _Block:
    """Device memory from the caching allocator, which tensors occupy one after another."""

    stream: int  # the stream it was allocated on, the only one the allocator knows of
    nbytes: int
    readers: list = field(default_factory=list)  # (stream, end, name) of kernels reading its current occupant
    recorded: set = field(default_factory=set)  # streams named by record_stream
    reusable_at: float = 0.0  # set when freed: when the recorded streams' work queued by then is done


@dataclass
class _DeviceTensor:
    block: _Block | None  # None for a kernel's output or a view: not followed by the allocator model
    ready: float  # when the copy (or kernel) that fills it ends
    name: str
    device: int = 0


class _Device:
    """One simulated device: its engines, its default stream and its current stream."""

    def __init__(self, gpu: SimulatedGPU, index: int):
        self.index = index
        self.engines = {"copy": 0.0, "kernel": 0.0}  # when each engine is next free
        self.default = self.current = _Stream(index, _gpu=gpu)


class _Stream:
    """torch.cuda.Stream on the simulated GPU."""

    def __init__(self, device=None, priority=0, _gpu=None, **kwargs):
        self._gpu = _gpu if _gpu is not None else _active_gpu()
        index = self._gpu._index(device)
        self.stream_id = next(self._gpu._stream_ids)  # device i's default stream is created first
        self.device_index = index
        self.device = torch.device("cuda", index)
        self.priority = priority
        self.tail = 0.0  # when the work queued on it so far ends
        self.barrier = 0.0  # work queued from now on starts no earlier (wait_stream, wait_event)
        self._gpu.streams.append(self)

    def done(self) -> float:
        """When the work queued on this stream so far is done."""
        return max(self._gpu.now, self.tail, self.barrier)

    def wait_stream(self, stream) -> None:
        self.barrier = max(self.barrier, stream.done())

    def wait_event(self, event) -> None:
        event.wait(self)

    def record_event(self, event=None):
        event = event if event is not None else _Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return self.done() <= self._gpu.now + _EPS

    def synchronize(self) -> None:
        self._gpu._host_wait(self.done(), f"stream {self.stream_id}.synchronize()")

    def __enter__(self):
        self._context = self._gpu._use_stream(self)
        return self._context.__enter__()

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)

    def __eq__(self, other):
        return isinstance(other, _Stream) and other.stream_id == self.stream_id

    def __hash__(self):
        return hash(self.stream_id)

    def __repr__(self) -> str:
        default = " (default)" if self is self._gpu.devices[self.device_index].default else ""
        return f"<simulated torch.cuda.Stream {self.stream_id} on cuda:{self.device_index}{default}>"


class _Event:
    """torch.cuda.Event on the simulated GPU."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, external=False):
        self._gpu = _active_gpu()
        self.enable_timing = enable_timing
        self.time = None  # when the work it marks is done; None until recorded
        self.device_index = None  # the device of the first stream it is recorded on (c10/cuda/CUDAEvent.h)

    @property
    def device(self):
        return None if self.device_index is None else torch.device("cuda", self.device_index)

    def record(self, stream=None) -> None:
        stream = stream if stream is not None else self._gpu.current  # the current device's current stream
        if self.device_index is not None and self.device_index != stream.device_index:
            raise RuntimeError(f"Event device {self.device_index} does not match recording stream's device "
                               f"{stream.device_index}.")
        self.device_index = stream.device_index
        self.time = stream.done()

    def wait(self, stream=None) -> None:
        stream = stream if stream is not None else self._gpu.current
        if self.time is not None:  # waiting for an event never recorded does nothing, as in CUDA
            stream.barrier = max(stream.barrier, self.time)

    def query(self) -> bool:
        return self.time is None or self.time <= self._gpu.now + _EPS

    def synchronize(self) -> None:
        if self.time is not None:
            self._gpu._host_wait(self.time, "Event.synchronize()")

    def elapsed_time(self, end_event) -> float:
        # The checks of c10/cuda/CUDAEvent.h (torch 2.14), in its order, with its exception types and messages.
        if not (self.enable_timing and end_event.enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self.time is None or end_event.time is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        if not (self.query() and end_event.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        if self.device_index != end_event.device_index:  # cudaEventElapsedTime fails across devices
            raise RuntimeError("CUDA error: invalid resource handle (the two events were recorded on different "
                               f"devices, cuda:{self.device_index} and cuda:{end_event.device_index})")
        return (end_event.time - self.time) * 1e3  # milliseconds


def _active_gpu() -> SimulatedGPU:
    """The SimulatedGPU whose `with` block the learner's code runs in: their torch.cuda.Stream() and Event() are its."""
    from course_lib.grading.simgpu.machine import SimulatedGPU  # machine.py builds on this module

    return SimulatedGPU.active()
