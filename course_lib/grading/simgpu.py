"""A simulated CUDA machine, so that graded tests can check stream code on a machine without a GPU (exercise 02).

Only graded tests use it, and only inside the child process that `course_lib.grading.run` starts for the
learner's code: it replaces parts of torch and of `time` for the whole process, so it refuses to start in
a process that is not a multiprocessing child (the test process, a notebook's kernel). The lessons never
use it: a notebook shows real measurements or says that it cannot make them.

Inside ``with SimulatedGPU(devices=2, modules=[learner_module]) as gpu:`` these calls are replaced by a model of
`devices` CUDA devices (also where the learner's module imported them by name, e.g. ``from time import
perf_counter``):

    torch.cuda.{is_available, device_count, current_device, set_device, device, get_device_name,
                Stream, Event, stream, current_stream, default_stream, set_stream, synchronize}
    torch.Tensor.{to, cuda, pin_memory, is_pinned, record_stream}
    time.{perf_counter, monotonic, time} and their _ns forms: the simulated host clock

and a torch function mode follows every other torch call on a device tensor (``x + y``, ``model(x)``,
``loss.item()``, ``x.device``, ``torch.zeros(..., device="cuda:1")``). A "device tensor" is an ordinary CPU
tensor that the model tracks, with the index of the device it lives on (values stay checkable: ``gpu.peek(t)``;
``t.device`` reports ``cuda:i`` while the simulation runs, and ``gpu.device_of(t)`` gives i). Time is logical
seconds, so verdicts are exact and cannot flake on a busy machine. What the model says, with the source of each
rule (PyTorch's CUDA semantics notes, the installed torch source, CUDA's programming guide and runtime API):

* Devices. There is a current device (0 at first; ``torch.cuda.set_device``, ``with torch.cuda.device(i)``,
  which restores the previous one on exit: torch/cuda/__init__.py ``device``). Each device has its own default
  stream, its own current stream, its own copy engine and compute engine, so work on two devices overlaps.
  ``torch.cuda.Stream(device)`` belongs to `device` (the current one if None). ``current_stream(d)``,
  ``default_stream(d)`` and ``synchronize(d)`` concern device d, the current device if None
  (torch/cuda/__init__.py: ``synchronize`` is ``with torch.cuda.device(device): _cuda_synchronize()``, and it
  waits only for that device).
* ``with torch.cuda.stream(s)`` (and ``set_stream(s)``) makes s the current stream *of s's device* and makes that
  device current; on exit both the previous current device and the previous current stream of s's device come
  back (torch/cuda/__init__.py ``StreamContext``; ``_cuda_setStream`` sets the device too).
* A copy to ``cuda:i`` (``.to``, ``.cuda``) is queued on device i's current stream, whatever the
  current device (aten/src/ATen/native/cuda/Copy.cu guards the destination's device and takes its current
  stream); ``.to("cuda")`` and ``.cuda()`` mean the current device. A kernel (any torch op on device tensors, or
  ``gpu.kernel``) runs on the current stream of the device its tensors live on; tensors of two devices in one op
  raise RuntimeError "Expected all tensors to be on the same device", as does an in-place op on a CPU tensor
  with a device tensor (TensorIterator's device check; a 0-d CPU tensor as a *non-output* operand is allowed).
  A copy between devices runs on the source device's current stream after a two-way barrier with the
  destination's current stream (Copy.cu ``copy_device_to_device``).
* The host queues work and moves on at once; its clock advances only when it waits for a device, when a test
  spends host time (`host_work`), or when it pins memory (below).
* A stream runs its work in the order queued; work on different streams may overlap, but on each device copies
  share one copy engine and kernels one compute engine, each taking work in the order it was queued.
* ``a.wait_stream(b)`` holds back work queued on ``a`` afterwards until the work queued on ``b`` *so far* is
  done, also across devices (torch/cuda/streams.py: it is ``a.wait_event(b.record_event())``; CUDA programming
  guide, "Stream and Event Behavior": cudaStreamWaitEvent works across devices). An event belongs to the device
  of the first stream it is recorded on, recording it on a stream of another device raises, as does
  ``elapsed_time`` between events of two devices (c10/cuda/CUDAEvent.h; "cudaEventElapsedTime() will fail if the
  two input events are associated to different devices"). ``Event.record()`` without a stream records on the
  current stream of the *current* device (torch/cuda/streams.py). An event completes when the work its stream
  held at ``record()`` is done; ``elapsed_time`` is in milliseconds and raises, with torch 2.14's types and
  messages (c10/cuda/CUDAEvent.h), for events without timing, not recorded, or not yet completed.
* A host-to-device ``.to(..., non_blocking=True)`` from pinned memory returns at once. With
  ``non_blocking=False`` the host waits for the copy's stream (c10 ``memcpy_and_sync``). From pageable memory
  with ``non_blocking=True`` the host waits for the copy: CUDA allows that ("might be synchronous with respect
  to host"), and this model takes the worst case.
* Reading a device tensor's value on the host (``item``, ``float``, ``int``, ``bool``, ``tolist``, ``cpu``,
  printing, ``torch.equal``) is a blocking device-to-host copy: the host waits for the tensor's device's current
  stream (listed in ``gpu.host_waits``); ``numpy()`` raises TypeError as on CUDA. A device-to-host
  ``.to("cpu", non_blocking=True)`` returns at once, into pinned memory (aten ``_to_copy``: ``pin_out``), and its
  values are not there until its stream reaches the copy: reading that CPU tensor (the same calls) before the
  host has waited that long is a problem (PyTorch tutorial "A guide on good usage of non_blocking and
  pin_memory()": a non-blocking device-to-host copy must be synchronised before the result is used).
* ``pin_memory()`` costs host time: nbytes / pin_bytes_per_second (by default the copy speed). Pinning is a
  page-locked allocation plus a host-to-host copy of every byte; the tutorial above measures
  ``t.pin_memory().to("cuda", non_blocking=True)`` slower than a plain ``t.to("cuda")``, so pinning costs about
  as much as the copy it enables. That is why DataLoader(pin_memory=True) pins in a background thread.
* The caching allocator (``record_stream``'s docstring): device memory is allocated on the current stream of its
  device; when a tensor dies its block can be reused at once by the next allocation *on that stream*, unless
  ``record_stream(s)`` named other streams: then only once the work queued on those streams at the free is done.

It records what went wrong instead of raising: ``gpu.problems`` lists a kernel or a host read that reads a
device tensor before the copy filling it has ended (a race), a copy that overwrites reused memory while a kernel
may still read its old contents (a use after free), and a host read of a non-blocking device-to-host copy
before it ended; ``gpu.host_waits`` lists every call that made the host wait; ``gpu.spans`` is the schedule that
ran. Tests queue the caller's work with ``gpu.kernel(seconds, reads=[...])``; torch ops on device tensors are
kernels of ``op_seconds`` (0 by default).

Not modelled, and not needed by the tests: launch costs; several copy engines or concurrent kernels; peer
access; ``copy_`` from the host into a device tensor (a kernel of ``op_seconds`` here); a CPU tensor of more than
0 dimensions mixed with a device tensor in an out-of-place op (allowed here, an error on CUDA); the device-generic ``torch.Stream``, ``torch.Event`` and
``torch.accelerator`` spellings. Exercise 02's docstrings list the calls to use.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import time
import types
import weakref
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

__all__ = ["SimulatedGPU", "Span"]

_EPS = 1e-12  # logical seconds: sums of floats that should be equal may differ by rounding

# Tensor methods that read a tensor's values on the host (a device-to-host copy the host waits for).
_HOST_READS = {"item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__", "__repr__", "__str__",
               "__format__", "__array__", "equal", "allclose", "is_nonzero", "cpu"}


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
        self._gpu = _gpu if _gpu is not None else SimulatedGPU.active()
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
        self._gpu = SimulatedGPU.active()
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


class _Mode(TorchFunctionMode):
    """Follows torch calls on device tensors (see SimulatedGPU._torch_function)."""

    def __init__(self, gpu):
        super().__init__()
        self.gpu = gpu

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        return self.gpu._torch_function(func, args, kwargs or {})


class SimulatedGPU:
    """A model of CUDA devices: streams, events, copies and the caching allocator (see the module docstring)."""

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

    def _check_host_read(self, tensor, what: str) -> None:
        pending = self._pending_host.get(id(tensor))
        if pending is not None and pending[0] > self.now + _EPS:
            self.problems.append(
                f"read before ready: {what} at {self.now:.4g} s reads a CPU tensor filled by a non-blocking "
                f"{pending[1]}, which ends at {pending[0]:.4g} s: synchronize (or read the device tensor) first")

    def _torch_function(self, func, args, kwargs):
        name = getattr(func, "__name__", "")
        descriptor = getattr(func, "__self__", None)
        if isinstance(descriptor, types.GetSetDescriptorType):  # a property of Tensor
            attribute, tensor = descriptor.__name__, args[0] if args else None
            tracked = self._tensors.get(id(tensor))
            if name == "__get__" and tracked is not None:
                if attribute == "device":
                    return torch.device("cuda", tracked.device)
                if attribute == "is_cuda":
                    return True
                if attribute == "is_cpu":
                    return False
            result = func(*args, **kwargs)
            if name == "__set__" and attribute == "data" and id(args[1]) in self._tensors:  # module.to(): p.data = t
                source = self._tensors[id(args[1])]
                self._track(tensor, _DeviceTensor(None, source.ready, source.name, source.device))
            return result
        if name == "get_device" and args and id(args[0]) in self._tensors:
            return self._tensors[id(args[0])].device
        device = kwargs.get("device")
        if device is not None and isinstance(device, (str, torch.device, int)) and not isinstance(device, bool):
            target = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
            if target.type == "cuda":  # a factory: torch.zeros(..., device="cuda:1")
                index = self._index(target)
                kwargs = {key: value for key, value in kwargs.items() if key != "pin_memory"}
                result = func(*args, **{**kwargs, "device": "cpu"})
                span = self._run_kernel(index, self.op_seconds, name, [])
                for out in tree_flatten(result)[0]:
                    if isinstance(out, torch.Tensor):
                        self._track(out, _DeviceTensor(None, span.end, f"{name}(device='cuda:{index}')", index))
                return result
        flat = tree_flatten((args, kwargs))[0]
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        tracked = {id(t): self._tensors[id(t)] for t in tensors if id(t) in self._tensors}
        if name in _HOST_READS and tensors:
            for t in tensors:
                self._check_host_read(t, f"{name}()")
            if tracked:
                first = next(t for t in tensors if id(t) in tracked)
                if name == "numpy" or name == "__array__":
                    raise TypeError(f"can't convert cuda:{tracked[id(first)].device} device type tensor to numpy. "
                                    "Use Tensor.cpu() to copy the tensor to host memory first.")
                if name == "cpu":
                    return self._to_host(first, False, why="Tensor.cpu()")
                for t in tensors:
                    if id(t) in tracked:
                        self._to_host(t, False, why=f"Tensor.{name}() reads a device tensor")
                with torch._C.DisableTorchFunction():
                    return func(*args, **kwargs)
            return func(*args, **kwargs)
        if not tracked:
            return func(*args, **kwargs)
        indices = sorted({entry.device for entry in tracked.values()})
        if len(indices) > 1:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"cuda:{indices[0]} and cuda:{indices[1]}! (in {name})")
        index = indices[0]
        if name == "copy_" and args and id(args[0]) not in tracked:  # a device-to-host copy into a CPU tensor
            return self._copy_to_host(args, kwargs)
        inplace = name.endswith("_") and not name.endswith("__") or name in ("__iadd__", "__isub__", "__imul__",
                                                                             "__itruediv__")
        if inplace and args and isinstance(args[0], torch.Tensor) and id(args[0]) not in tracked:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"cuda:{index} and cpu! (in {name}: an in-place op on a CPU tensor with a device "
                               "tensor)")
        result = func(*args, **kwargs)
        outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        if not outputs:
            return result  # metadata: size, dim, dtype...
        storages = {self._storage(t) for t in tensors if id(t) in tracked}
        new = [t for t in outputs if id(t) not in tracked and self._storage(t) not in storages]
        written = [t for t in outputs if id(t) in tracked and inplace]
        if new or written or name == "copy_":
            span = self._run_kernel(index, self.op_seconds, name, list(tracked.values()))
            for t in written:
                self._tensors[id(t)].ready = span.end
            for t in new:
                self._track(t, _DeviceTensor(None, span.end, f"the output of {name}", index))
        for t in outputs:  # views share their base's memory and readiness
            if id(t) not in self._tensors:
                base = next((tracked[id(t2)] for t2 in tensors
                             if id(t2) in tracked and self._storage(t2) == self._storage(t)), None)
                if base is not None:
                    self._track(t, _DeviceTensor(None, base.ready, base.name, index))
        return result

    def _copy_to_host(self, args, kwargs):
        destination, source = args[0], args[1]
        non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
        copied = self._to_host(source, non_blocking)
        with torch._C.DisableTorchFunction():
            destination.copy_(copied)
        if non_blocking:
            self._pending_host[id(destination)] = self._pending_host.get(id(copied))
            weakref.finalize(destination, self._pending_host.pop, id(destination), None)
        return destination

    @staticmethod
    def _storage(t) -> int:
        with torch._C.DisableTorchFunction():
            return t.untyped_storage().data_ptr()

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

    def _target_of(self, value):
        """(is a device named, index or None for the host) for a .to() argument; (False, None) for a dtype..."""
        if isinstance(value, torch.Tensor):
            tracked = self._tensors.get(id(value))
            if tracked is not None:
                return True, tracked.device
            return True, None
        if isinstance(value, (str, torch.device)) or (isinstance(value, int) and not isinstance(value, bool)):
            try:
                device = torch.device(value) if not isinstance(value, int) else torch.device("cuda", value)
            except (RuntimeError, TypeError):
                return False, None
            return True, (self._index(device) if device.type == "cuda" else None)
        return False, None

    def _patches(self, original_to):
        gpu = self

        def to(tensor, *args, **kwargs):
            named, index = gpu._target_of(kwargs.get("device", args[0] if args else None))
            dtype = kwargs.get("dtype", next((a for a in args if isinstance(a, torch.dtype)), None))
            if isinstance(args[0] if args else None, torch.Tensor) and dtype is None:
                dtype = args[0].dtype
            non_blocking = kwargs.get("non_blocking", False) or any(a is True for a in args)
            if named and index is not None:
                return gpu._to_device(tensor, non_blocking, dtype, index)
            if named and gpu.is_device_tensor(tensor):  # device to host
                return gpu._to_host(tensor, non_blocking, dtype)
            if not named and dtype is not None and gpu.is_device_tensor(tensor):  # a dtype change on the device
                return gpu._to_device(tensor, non_blocking, dtype, gpu.device_of(tensor))
            with torch._C.DisableTorchFunction():
                return original_to(tensor, *args, **kwargs)

        def cuda(tensor, device=None, non_blocking=False, **kwargs):
            return gpu._to_device(tensor, non_blocking, None, device)

        def pin_memory(tensor, *args, **kwargs):
            if id(tensor) in gpu._pinned:
                return tensor
            with torch._C.DisableTorchFunction():
                pinned = tensor.detach().clone()
                gpu.now += pinned.numel() * pinned.element_size() / gpu.pin_bytes_per_second
            gpu._pinned.add(id(pinned))
            weakref.finalize(pinned, gpu._pinned.discard, id(pinned))
            return pinned

        def record_stream(tensor, stream):
            if not gpu.is_device_tensor(tensor):
                raise RuntimeError("record_stream needs a CUDA tensor (on the simulated GPU: one made by .to('cuda'))")
            block = gpu._tensors[id(tensor)].block
            if block is not None:
                block.recorded.add(stream.stream_id)

        def synchronize(device=None):
            index = gpu._index(device)
            streams = [s.done() for s in gpu.streams if s.device_index == index]
            gpu._host_wait(max([gpu.now, *streams]),
                           "torch.cuda.synchronize()" if device is None else f"torch.cuda.synchronize({device!r})")

        def set_stream(stream):
            if stream is not None:
                gpu.current_device = stream.device_index
                gpu.devices[stream.device_index].current = stream

        def set_device(device):
            gpu.current_device = gpu._index(device)

        clock = lambda: gpu.now  # noqa: E731
        return [
            (torch.cuda, "is_available", lambda: True),
            (torch.cuda, "device_count", lambda: gpu.device_count),
            (torch.cuda, "current_device", lambda: gpu.current_device),
            (torch.cuda, "set_device", set_device),
            (torch.cuda, "device", gpu._use_device),
            (torch.cuda, "get_device_name", lambda device=None: "simulated GPU"),
            (torch.cuda, "Stream", _Stream),
            (torch.cuda, "Event", _Event),
            (torch.cuda, "stream", gpu._use_stream),
            (torch.cuda, "current_stream", lambda device=None: gpu.devices[gpu._index(device)].current),
            (torch.cuda, "default_stream", lambda device=None: gpu.devices[gpu._index(device)].default),
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
        self.devices = [_Device(self, index) for index in range(self.device_count)]  # default streams 0..n-1
        for owner, name, replacement in self._patches(torch.Tensor.to):
            original = getattr(owner, name)
            self._saved.append((owner, name, name in vars(owner), vars(owner).get(name)))
            setattr(owner, name, replacement)
            for module in self.modules:  # `from time import perf_counter` took the original before we came
                for global_name, value in list(vars(module).items()):
                    if value is original:
                        self._saved.append((module, global_name, True, value))
                        setattr(module, global_name, replacement)
        self._mode = _Mode(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
        for owner, name, present, value in reversed(self._saved):
            if present:
                setattr(owner, name, value)
            else:
                delattr(owner, name)
        self._saved.clear()
        SimulatedGPU._active = None
