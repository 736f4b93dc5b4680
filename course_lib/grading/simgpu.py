"""A simulated CUDA device, so that graded tests can check stream code on a machine without a GPU (exercise 02).

Only graded tests use it, and only inside the child process that `course_lib.grading.run` starts for the
learner's code: it replaces parts of torch and of `time` for the whole process, so it refuses to start in
a process that is not a multiprocessing child (the test process, a notebook's kernel). The lessons never
use it: a notebook shows real measurements or says that it cannot make them.

Inside ``with SimulatedGPU(modules=[learner_module]) as gpu:`` these calls are replaced by a model of one
device (also where the learner's module imported them by name, e.g. ``from time import perf_counter``):

    torch.cuda.{is_available, device_count, current_device, set_device, device, get_device_name,
                Stream, Event, stream, current_stream, default_stream, set_stream, synchronize}
    torch.Tensor.{to, cuda, pin_memory, is_pinned, record_stream}
    time.{perf_counter, monotonic, time} and their _ns forms: the simulated host clock

A "device tensor" is an ordinary CPU tensor that the model tracks (values stay checkable). Time is logical
seconds, so verdicts are exact and cannot flake on a busy machine. What the model says, with the source of each
rule (PyTorch's CUDA semantics notes, the installed torch source, CUDA's runtime API):

* The host queues work and moves on at once; its clock advances only when it waits for the device, or when a
  test spends host time (`host_work`).
* A stream runs its work in the order queued; work on different streams may overlap, but copies share one copy
  engine and kernels one compute engine, each taking work in the order it was queued.
* ``a.wait_stream(b)`` holds back work queued on ``a`` afterwards until the work queued on ``b`` *so far* is
  done (torch/cuda/streams.py: it is ``a.wait_event(b.record_event())``). An event completes when the work its
  stream held at ``record()`` is done; ``elapsed_time`` is in milliseconds and raises, with torch 2.14's types
  and messages (c10/cuda/CUDAEvent.h), for events without timing, not recorded, or not yet completed.
* A host-to-device ``.to(..., non_blocking=True)`` from pinned memory returns at once. With
  ``non_blocking=False`` the host waits for the current stream (c10 ``memcpy_and_sync``). From pageable memory
  with ``non_blocking=True`` the host waits for the copy: CUDA allows that ("might be synchronous with respect
  to host"), and this model takes the worst case.
* The caching allocator (``record_stream``'s docstring): device memory is allocated on the current stream; when
  a tensor dies its block can be reused at once by the next allocation *on that stream*, unless
  ``record_stream(s)`` named other streams: then only once the work queued on those streams at the free is done.

It records what went wrong instead of raising: ``gpu.problems`` lists a kernel that reads a device tensor
before the copy filling it has ended (a race), and a copy that overwrites reused memory while a kernel may
still read its old contents (a use after free); ``gpu.host_waits`` lists every call that made the host wait;
``gpu.spans`` is the schedule that ran. Tests queue the caller's work with ``gpu.kernel(seconds, reads=[...])``.

Not modelled, and not needed by the tests: launch costs and the host time of pinning; several copy engines
or concurrent kernels; device tensors made any other way than ``.to()``/``.cuda()`` (``torch.empty(...,
device="cuda")``, ``copy_`` into a preallocated tensor); the device-generic ``torch.Stream``, ``torch.Event``
and ``torch.accelerator`` spellings. Exercise 02's docstrings list the calls to use.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import time
import weakref
from dataclasses import dataclass, field

import torch

__all__ = ["SimulatedGPU", "Span"]

_EPS = 1e-12  # logical seconds: sums of floats that should be equal may differ by rounding


@dataclass(frozen=True)
class Span:
    """One piece of simulated device work: the stream it ran on, what it was, and when (logical seconds)."""

    stream: int
    kind: str  # "copy" or "kernel"
    name: str
    start: float
    end: float


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
    block: _Block
    ready: float  # when the copy that fills it ends
    name: str


class _Stream:
    """torch.cuda.Stream on the simulated GPU."""

    def __init__(self, device=None, priority=0, **kwargs):
        self._gpu = SimulatedGPU.active()
        self.stream_id = next(self._gpu._stream_ids)  # 0 is the default stream
        self.device = torch.device("cuda", 0)
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

    def __repr__(self) -> str:
        return f"<simulated torch.cuda.Stream {self.stream_id}{' (default)' if self.stream_id == 0 else ''}>"


class _Event:
    """torch.cuda.Event on the simulated GPU."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, external=False):
        self._gpu = SimulatedGPU.active()
        self.enable_timing = enable_timing
        self.time = None  # when the work it marks is done; None until recorded

    def record(self, stream=None) -> None:
        self.time = (stream if stream is not None else self._gpu.current).done()

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
        return (end_event.time - self.time) * 1e3  # milliseconds


class SimulatedGPU:
    """A model of one CUDA device: streams, events, copies and the caching allocator (see the module docstring)."""

    _active: SimulatedGPU | None = None

    def __init__(self, bytes_per_second: float = 4096.0, *, modules=()):
        self.bytes_per_second = bytes_per_second  # copy speed
        self.modules = list(modules)  # modules whose globals may hold a replaced function (from time import ...)
        self.now = 0.0  # the host clock
        self.engines = {"copy": 0.0, "kernel": 0.0}  # when each engine is next free
        self.streams: list[_Stream] = []
        self.spans: list[Span] = []
        self.problems: list[str] = []
        self.host_waits: list[str] = []
        self._stream_ids = itertools.count()
        self._tensors: dict[int, _DeviceTensor] = {}  # id(tensor) -> where it lives
        self._pinned: set[int] = set()
        self._free_blocks: list[_Block] = []
        self._copies = itertools.count()
        self._saved: list[tuple] = []

    @classmethod
    def active(cls) -> SimulatedGPU:
        if cls._active is None:
            raise RuntimeError("no SimulatedGPU is active")
        return cls._active

    # ------------------------------------------------------------------ what tests call
    def kernel(self, seconds: float, reads=(), name: str = "kernel") -> Span:
        """Queue a kernel of `seconds` on the current stream that reads the device tensors in `reads`."""
        span = self._enqueue(self.current, "kernel", seconds, name)
        for t in reads:
            tracked = self._tensors.get(id(t)) if isinstance(t, torch.Tensor) else None
            if tracked is None:
                continue
            if tracked.ready > span.start + _EPS:
                self.problems.append(f"race: {name} on stream {span.stream} starts at {span.start:.4g} s and reads "
                                     f"{tracked.name}, whose copy ends at {tracked.ready:.4g} s")
            tracked.block.readers.append((span.stream, span.end, name))
        return span

    def host_work(self, seconds: float) -> None:
        """Spend host time (CPU work between launches)."""
        self.now += seconds

    def read_back(self) -> None:
        """The host waits for the current stream, as `loss.item()` does (not counted in host_waits)."""
        self.now = max(self.now, self.current.done())

    def finish(self) -> float:
        """Wait for all the work (not counted in host_waits); return the host clock: the total time."""
        self.now = max([self.now, *(s.end for s in self.spans)])
        return self.now

    def is_device_tensor(self, t) -> bool:
        return isinstance(t, torch.Tensor) and id(t) in self._tensors

    # ------------------------------------------------------------------ the model
    def _host_wait(self, until: float, why: str) -> None:
        self.host_waits.append(why)
        self.now = max(self.now, until)

    def _enqueue(self, stream: _Stream, kind: str, seconds: float, name: str) -> Span:
        start = max(stream.done(), self.engines[kind])
        span = Span(stream.stream_id, kind, name, start, start + seconds)
        stream.tail = self.engines[kind] = span.end
        self.spans.append(span)
        return span

    def _allocate(self, nbytes: int) -> tuple[_Block, list]:
        """A block on the current stream, reused if one is free there; and the readers of its previous occupant."""
        stream = self.current.stream_id
        free = [b for b in self._free_blocks
                if b.stream == stream and b.nbytes >= nbytes and b.reusable_at <= self.now + _EPS]
        if not free:
            return _Block(stream, nbytes), []
        block = min(free, key=lambda b: b.nbytes)  # best fit, as the caching allocator does
        self._free_blocks.remove(block)
        previous, block.readers = block.readers, []
        return block, previous

    def _free(self, key: int) -> None:
        tracked = self._tensors.pop(key, None)
        if tracked is None:
            return
        block = tracked.block
        others = [s for s in self.streams if s.stream_id in block.recorded and s.stream_id != block.stream]
        block.reusable_at = max([0.0, *(s.done() for s in others)])
        block.recorded = set()
        self._free_blocks.append(block)

    def _to_device(self, tensor: torch.Tensor, non_blocking: bool, dtype=None) -> torch.Tensor:
        if self.is_device_tensor(tensor):
            return tensor
        data = tensor.detach().clone() if dtype is None else tensor.detach().to(dtype=dtype, copy=True)
        nbytes = data.numel() * data.element_size()
        block, previous = self._allocate(nbytes)
        name = f"copy #{next(self._copies)} ({nbytes} B)"
        span = self._enqueue(self.current, "copy", nbytes / self.bytes_per_second, name)
        for reader_stream, reader_end, reader in previous:
            if reader_end > span.start + _EPS:
                self.problems.append(
                    f"use after free: {name} on stream {span.stream} writes at {span.start:.4g} s into memory that "
                    f"{reader} on stream {reader_stream} still reads until {reader_end:.4g} s (a tensor was freed "
                    "and its memory reused while another stream still read it)")
        self._tensors[id(data)] = _DeviceTensor(block, span.end, name)
        weakref.finalize(data, self._free, id(data))
        if not non_blocking:
            self._host_wait(self.current.done(), "a blocking copy (non_blocking=False)")
        elif id(tensor) not in self._pinned:
            self._host_wait(span.end, "a copy from pageable memory (not pinned)")
        return data

    @contextlib.contextmanager
    def _use_stream(self, stream):
        previous = self.current
        self.current = stream if stream is not None else previous
        try:
            yield stream
        finally:
            self.current = previous

    def _device_of(self, value):
        """The device a .to() argument names, or None (a dtype, a bool...)."""
        if isinstance(value, torch.Tensor):
            return torch.device("cuda", 0) if self.is_device_tensor(value) else value.device
        if isinstance(value, (str, torch.device)) or (isinstance(value, int) and not isinstance(value, bool)):
            try:
                return torch.device(value)
            except (RuntimeError, TypeError):
                return None
        return None

    def _patches(self, original_to):
        gpu = self

        def to(tensor, *args, **kwargs):
            device = gpu._device_of(kwargs.get("device", args[0] if args else None))
            dtype = kwargs.get("dtype", next((a for a in args if isinstance(a, torch.dtype)), None))
            non_blocking = kwargs.get("non_blocking", False) or any(a is True for a in args)
            if device is not None and device.type == "cuda":
                return gpu._to_device(tensor, non_blocking, dtype)
            if device is not None and gpu.is_device_tensor(tensor):  # device to host
                if not non_blocking:
                    gpu._host_wait(gpu.current.done(), "a device-to-host copy")
                return tensor.detach().to(dtype=dtype or tensor.dtype, copy=True)
            return original_to(tensor, *args, **kwargs)

        def cuda(tensor, device=None, non_blocking=False, **kwargs):
            return gpu._to_device(tensor, non_blocking)

        def pin_memory(tensor, *args, **kwargs):
            if id(tensor) in gpu._pinned:
                return tensor
            pinned = tensor.detach().clone()
            gpu._pinned.add(id(pinned))
            weakref.finalize(pinned, gpu._pinned.discard, id(pinned))
            return pinned

        def record_stream(tensor, stream):
            if not gpu.is_device_tensor(tensor):
                raise RuntimeError("record_stream needs a CUDA tensor (on the simulated GPU: one made by .to('cuda'))")
            gpu._tensors[id(tensor)].block.recorded.add(stream.stream_id)

        def synchronize(device=None):
            gpu._host_wait(max([gpu.now, *(s.done() for s in gpu.streams)]), "torch.cuda.synchronize()")

        def set_stream(stream):
            if stream is not None:
                gpu.current = stream

        clock = lambda: gpu.now  # noqa: E731
        return [
            (torch.cuda, "is_available", lambda: True),
            (torch.cuda, "device_count", lambda: 1),
            (torch.cuda, "current_device", lambda: 0),
            (torch.cuda, "set_device", lambda device: None),
            (torch.cuda, "device", lambda device=None: contextlib.nullcontext()),
            (torch.cuda, "get_device_name", lambda device=None: "simulated GPU"),
            (torch.cuda, "Stream", _Stream),
            (torch.cuda, "Event", _Event),
            (torch.cuda, "stream", gpu._use_stream),
            (torch.cuda, "current_stream", lambda device=None: gpu.current),
            (torch.cuda, "default_stream", lambda device=None: gpu.default),
            (torch.cuda, "set_stream", set_stream),
            (torch.cuda, "synchronize", synchronize),
            (torch.Tensor, "to", to),
            (torch.Tensor, "cuda", cuda),
            (torch.Tensor, "pin_memory", pin_memory),
            (torch.Tensor, "is_pinned", lambda tensor, *args, **kwargs: id(tensor) in gpu._pinned),
            (torch.Tensor, "record_stream", record_stream),
            (time, "perf_counter", clock),
            (time, "perf_counter_ns", lambda: int(gpu.now * 1e9)),
            (time, "monotonic", clock),
            (time, "monotonic_ns", lambda: int(gpu.now * 1e9)),
            (time, "time", lambda: 1.7e9 + gpu.now),
            (time, "time_ns", lambda: int((1.7e9 + gpu.now) * 1e9)),
        ]

    def __enter__(self) -> SimulatedGPU:
        if multiprocessing.parent_process() is None:
            raise RuntimeError("SimulatedGPU patches torch and time for the whole process: use it only in the child "
                               "process that runs a learner's code (in a driver passed to course_lib.grading.run)")
        if SimulatedGPU._active is not None:
            raise RuntimeError("a SimulatedGPU is already active")
        SimulatedGPU._active = self
        self.default = self.current = _Stream()  # stream 0
        for owner, name, replacement in self._patches(torch.Tensor.to):
            original = getattr(owner, name)
            self._saved.append((owner, name, name in vars(owner), vars(owner).get(name)))
            setattr(owner, name, replacement)
            for module in self.modules:  # `from time import perf_counter` took the original before we came
                for global_name, value in list(vars(module).items()):
                    if value is original:
                        self._saved.append((module, global_name, True, value))
                        setattr(module, global_name, replacement)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, present, value in reversed(self._saved):
            if present:
                setattr(owner, name, value)
            else:
                delattr(owner, name)
        self._saved.clear()
        SimulatedGPU._active = None
