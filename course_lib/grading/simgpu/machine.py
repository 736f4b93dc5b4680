"""The simulated machine (exercise 02): its host clock, the work queued on each device's copy and compute engines,
the caching allocator, the copies between host and devices, and what went wrong (races, uses after free, reads
before a copy ended) recorded instead of raised.

Tests call `kernel`, `host_work`, `read_back`, `finish`, `peek` and `device_of`, and read `spans`, `problems`
and `host_waits`. The timeline's pieces (streams, events, devices) are in course_lib/grading/simgpu/timeline.py,
the torch calls the machine stands in for in course_lib/grading/simgpu/standins.py, and the rules with their
sources in the package's docstring (course_lib/grading/simgpu/__init__.py).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import weakref

import torch

from course_lib.grading.simgpu import standins
from course_lib.grading.simgpu.timeline import _EPS, Span, _Block, _Device, _DeviceTensor, _Stream

__all__ = ["SimulatedGPU"]


class SimulatedGPU:
    """A model of CUDA devices: streams, events, copies and the caching allocator (see the package's docstring)."""

    _active: SimulatedGPU | None = None

    def __init__(self, bytes_per_second: float = 4096.0, *, modules=(), devices: int = 1,
                 pin_bytes_per_second: float | None = None, op_seconds: float = 0.0):
        if devices < 1:
            raise ValueError(f"need at least one device, got {devices}")
        self.bytes_per_second = bytes_per_second  # copy speed
        self.pin_bytes_per_second = pin_bytes_per_second or bytes_per_second  # host time of pin_memory()
        self.op_seconds = op_seconds  # how long a torch op on device tensors takes
        self.device_count = devices
        self.modules = list(modules)  # modules whose globals may hold a replaced function (from time import ...)
        self.now = 0.0  # the host clock
        self.streams: list[_Stream] = []
        self.spans: list[Span] = []
        self.problems: list[str] = []
        self.host_waits: list[str] = []
        self.current_device = 0
        self.devices: list[_Device] = []
        self._stream_ids = itertools.count()
        self._tensors: dict[int, _DeviceTensor] = {}  # id(tensor) -> where it lives
        self._pinned: set[int] = set()
        self._pending_host: dict[int, tuple[float, str]] = {}  # id(cpu tensor) -> (when its D2H copy ends, name)
        self._free_blocks: list[_Block] = []
        self._copies = itertools.count()
        self._saved: list[tuple] = []
        self._mode = None

    @classmethod
    def active(cls) -> SimulatedGPU:
        if cls._active is None:
            raise RuntimeError("no SimulatedGPU is active")
        return cls._active

    # ------------------------------------------------------------------ what tests call
    @property
    def current(self) -> _Stream:
        """The current stream of the current device."""
        return self.devices[self.current_device].current

    @property
    def default(self) -> _Stream:
        """The default stream of the current device."""
        return self.devices[self.current_device].default

    def engines(self, device: int = 0) -> dict:
        return self.devices[device].engines

    def kernel(self, seconds: float, reads=(), name: str = "kernel", device=None) -> Span:
        """Queue a kernel of `seconds` that reads the device tensors in `reads`, on the current stream of `device`
        (by default the device those tensors live on, else the current device), as a torch op would run."""
        tracked = [self._tensors[id(t)] for t in reads if isinstance(t, torch.Tensor) and id(t) in self._tensors]
        index = self._index(device) if device is not None else (tracked[0].device if tracked else None)
        return self._run_kernel(self._index(index), seconds, name, tracked)

    def host_work(self, seconds: float) -> None:
        """Spend host time (CPU work between launches)."""
        self.now += seconds

    def read_back(self, device=None) -> None:
        """The host waits for a device's current stream, as `loss.item()` does (not counted in host_waits)."""
        self.now = max(self.now, self.devices[self._index(device)].current.done())

    def finish(self) -> float:
        """Wait for all the work (not counted in host_waits); return the host clock: the total time."""
        self.now = max([self.now, *(s.end for s in self.spans)])
        return self.now

    def is_device_tensor(self, t) -> bool:
        return isinstance(t, torch.Tensor) and id(t) in self._tensors

    def device_of(self, t) -> int | None:
        """The index of the simulated device `t` lives on, or None for a tensor of the host (or not a tensor)."""
        tracked = self._tensors.get(id(t)) if isinstance(t, torch.Tensor) else None
        return None if tracked is None else tracked.device

    def peek(self, t) -> torch.Tensor:
        """A CPU copy of `t`'s values, for a test's checks: no wait, no race check, nothing recorded."""
        with torch._C.DisableTorchFunction():
            return t.detach().clone()

    # ------------------------------------------------------------------ the model
    def _index(self, device) -> int:
        """The device index that a torch.cuda call's `device` argument names (None: the current device)."""
        if device is None:
            return self.current_device
        if isinstance(device, _Stream):
            return device.device_index
        if isinstance(device, torch.device):
            index = device.index
        elif isinstance(device, int) and not isinstance(device, bool):
            index = device
        elif isinstance(device, str):
            index = torch.device(device).index
        else:
            raise TypeError(f"expected a device, got {device!r}")
        if isinstance(device, (str, torch.device)) and torch.device(device).type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {device}")
        if index is None or index == -1:
            return self.current_device
        if not 0 <= index < self.device_count:
            raise RuntimeError(f"CUDA error: invalid device ordinal (cuda:{index}; the simulated machine has "
                               f"{self.device_count} device{'s' if self.device_count > 1 else ''})")
        return index

    def _host_wait(self, until: float, why: str) -> None:
        self.host_waits.append(why)
        self.now = max(self.now, until)

    def _enqueue(self, stream: _Stream, kind: str, seconds: float, name: str, after: float = 0.0) -> Span:
        engines = self.devices[stream.device_index].engines
        start = max(stream.done(), engines[kind], after)
        span = Span(stream.stream_id, kind, name, start, start + seconds, stream.device_index)
        stream.tail = engines[kind] = span.end
        self.spans.append(span)
        return span

    def _run_kernel(self, index: int, seconds: float, name: str, reads) -> Span:
        span = self._enqueue(self.devices[index].current, "kernel", seconds, name)
        for tracked in reads:
            if tracked.ready > span.start + _EPS:
                self.problems.append(f"race: {name} on stream {span.stream} (cuda:{index}) starts at {span.start:.4g} "
                                     f"s and reads {tracked.name}, whose copy ends at {tracked.ready:.4g} s")
            if tracked.block is not None:
                tracked.block.readers.append((span.stream, span.end, name))
        return span

    def _track(self, tensor: torch.Tensor, entry: _DeviceTensor) -> None:
        self._tensors[id(tensor)] = entry
        weakref.finalize(tensor, self._free, id(tensor), entry)

    def _allocate(self, stream: _Stream, nbytes: int) -> tuple[_Block, list]:
        """A block on `stream`, reused if one is free there; and the readers of its previous occupant."""
        free = [b for b in self._free_blocks
                if b.stream == stream.stream_id and b.nbytes >= nbytes and b.reusable_at <= self.now + _EPS]
        if not free:
            return _Block(stream.stream_id, nbytes), []
        block = min(free, key=lambda b: b.nbytes)  # best fit, as the caching allocator does
        self._free_blocks.remove(block)
        previous, block.readers = block.readers, []
        return block, previous

    def _free(self, key: int, entry: _DeviceTensor) -> None:
        if self._tensors.get(key) is entry:
            del self._tensors[key]
        block = entry.block
        if block is None:
            return
        others = [s for s in self.streams if s.stream_id in block.recorded and s.stream_id != block.stream]
        block.reusable_at = max([0.0, *(s.done() for s in others)])
        block.recorded = set()
        self._free_blocks.append(block)

    def _to_device(self, tensor: torch.Tensor, non_blocking: bool, dtype=None, index=None) -> torch.Tensor:
        with torch._C.DisableTorchFunction():
            index = self._index(index)
            source = self._tensors.get(id(tensor))
            if source is not None and source.device == index and (dtype is None or dtype == tensor.dtype):
                return tensor
            data = tensor.detach().clone() if dtype is None else tensor.detach().to(dtype=dtype, copy=True)
            nbytes = data.numel() * data.element_size()
            if source is not None and source.device == index:  # a dtype change on the device: a kernel
                span = self._run_kernel(index, self.op_seconds, f"to({dtype})", [source])
                self._track(data, _DeviceTensor(None, span.end, f"to({dtype}) of {source.name}", index))
                return data
            destination = self.devices[index].current
            stream = self.devices[source.device].current if source is not None else destination
            block, previous = self._allocate(destination, nbytes)
            kind = "device-to-device copy" if source is not None else "copy"
            name = f"{kind} #{next(self._copies)} ({nbytes} B to cuda:{index})"
            after = destination.done() if source is not None else 0.0  # Copy.cu: a two-way barrier across devices
            span = self._enqueue(stream, "copy", nbytes / self.bytes_per_second, name, after)
            if source is not None:
                if source.ready > span.start + _EPS:
                    self.problems.append(f"race: {name} starts at {span.start:.4g} s and reads {source.name}, "
                                         f"whose copy ends at {source.ready:.4g} s")
                destination.barrier = max(destination.barrier, span.end)
            for reader_stream, reader_end, reader in previous:
                if reader_end > span.start + _EPS:
                    self.problems.append(
                        f"use after free: {name} on stream {span.stream} writes at {span.start:.4g} s into memory "
                        f"that {reader} on stream {reader_stream} still reads until {reader_end:.4g} s (a tensor was "
                        "freed and its memory reused while another stream still read it)")
            self._track(data, _DeviceTensor(block, span.end, name, index))
            if source is None:
                if not non_blocking:
                    self._host_wait(span.end, "a blocking copy (non_blocking=False)")
                elif id(tensor) not in self._pinned:
                    self._host_wait(span.end, "a copy from pageable memory (not pinned)")
            return data

    def _to_host(self, tensor: torch.Tensor, non_blocking: bool, dtype=None, why: str = "a device-to-host copy"):
        """A device-to-host copy of a device tensor, on its device's current stream."""
        with torch._C.DisableTorchFunction():
            source = self._tensors[id(tensor)]
            data = tensor.detach().to(dtype=dtype or tensor.dtype, copy=True)
            nbytes = data.numel() * data.element_size()
            name = f"device-to-host copy #{next(self._copies)} ({nbytes} B from cuda:{source.device})"
            span = self._enqueue(self.devices[source.device].current, "copy", nbytes / self.bytes_per_second, name)
            if source.ready > span.start + _EPS:
                self.problems.append(f"race: {name} starts at {span.start:.4g} s and reads {source.name}, "
                                     f"whose copy ends at {source.ready:.4g} s")
            if non_blocking:  # into pinned memory, at once (aten _to_copy: pin_out)
                self._pinned.add(id(data))
                weakref.finalize(data, self._pinned.discard, id(data))
                self._pending_host[id(data)] = (span.end, name)
                weakref.finalize(data, self._pending_host.pop, id(data), None)
            else:
                self._host_wait(span.end, why)
            return data

    @contextlib.contextmanager
    def _use_stream(self, stream):
        """torch.cuda.stream(s): s becomes the current stream of its device, and that device the current one."""
        if stream is None:
            yield None
            return
        previous_device = self.current_device
        source, target = self.devices[previous_device], self.devices[stream.device_index]
        previous_source, previous_target = source.current, target.current
        self.current_device = stream.device_index
        target.current = stream
        try:
            yield stream
        finally:
            target.current = previous_target
            source.current = previous_source
            self.current_device = previous_device

    @contextlib.contextmanager
    def _use_device(self, device):
        """torch.cuda.device(d): d is the current device inside; the previous one comes back on exit."""
        index = self._index(device) if device is not None else None
        previous = self.current_device
        if index is not None:
            self.current_device = index
        try:
            yield
        finally:
            self.current_device = previous

    def __enter__(self) -> SimulatedGPU:
        if multiprocessing.parent_process() is None:
            raise RuntimeError("SimulatedGPU patches torch and time for the whole process: use it only in the child "
                               "process that runs a learner's code (in a driver passed to course_lib.grading.run)")
        if SimulatedGPU._active is not None:
            raise RuntimeError("a SimulatedGPU is already active")
        SimulatedGPU._active = self
        self.devices = [_Device(self, index) for index in range(self.device_count)]  # default streams 0..n-1
        standins.install(self)
        return self

    def __exit__(self, *exc) -> None:
        standins.uninstall(self, *exc)
        SimulatedGPU._active = None
