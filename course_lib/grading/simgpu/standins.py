"""The torch and time calls that the simulated machine stands in for while it runs (exercise 02).

`install` puts a stand-in in place of each call of `patches`' table (torch.cuda's functions and classes, the
Tensor methods that copy or pin, and time's clocks), also where the learner's module imported one by name, and
enters a torch function mode; `uninstall` puts the originals back. The mode's `torch_function` sees every other
torch call: a Tensor property (`x.device`), a factory (`torch.zeros(..., device="cuda:1")`), a read of values on
the host (`loss.item()`) and an op on device tensors, a kernel on the current stream of their device. The machine
they act on is course_lib/grading/simgpu/machine.py; the rules are in the package's docstring.
"""

from __future__ import annotations

import time
import types
import weakref
from typing import TYPE_CHECKING

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from course_lib.grading.simgpu.timeline import _EPS, _DeviceTensor, _Event, _Stream

if TYPE_CHECKING:
    from course_lib.grading.simgpu.machine import SimulatedGPU

# Tensor methods that read a tensor's values on the host (a device-to-host copy the host waits for).
_HOST_READS = {"item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__", "__repr__", "__str__",
               "__format__", "__array__", "equal", "allclose", "is_nonzero", "cpu"}
_INPLACE_OPERATORS = ("__iadd__", "__isub__", "__imul__", "__itruediv__")


# ------------------------------------------------------------------ putting the stand-ins in place


def install(gpu: SimulatedGPU) -> None:
    """The stand-ins in place of the originals (their owners' and gpu.modules' names), and the torch function mode."""
    for owner, name, replacement in patches(gpu, torch.Tensor.to):
        original = getattr(owner, name)
        gpu._saved.append((owner, name, name in vars(owner), vars(owner).get(name)))
        setattr(owner, name, replacement)
        for module in gpu.modules:  # `from time import perf_counter` took the original before we came
            for global_name, value in list(vars(module).items()):
                if value is original:
                    gpu._saved.append((module, global_name, True, value))
                    setattr(module, global_name, replacement)
    gpu._mode = _Mode(gpu)
    gpu._mode.__enter__()


def uninstall(gpu: SimulatedGPU, *exc) -> None:
    """The originals back, in the reverse order of `install`."""
    if gpu._mode is not None:
        gpu._mode.__exit__(*exc)
        gpu._mode = None
    for owner, name, present, value in reversed(gpu._saved):
        if present:
            setattr(owner, name, value)
        else:
            delattr(owner, name)
    gpu._saved.clear()


def patches(gpu: SimulatedGPU, original_to) -> list[tuple]:
    """(owner, name, stand-in) for each call replaced: torch.cuda's, then torch.Tensor's, then time's."""
    return [*_cuda_calls(gpu), *_tensor_methods(gpu, original_to), *_clocks(gpu)]


# ------------------------------------------------------------------ the stand-ins


def _cuda_calls(gpu: SimulatedGPU) -> list[tuple]:
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
    ]


def _tensor_methods(gpu: SimulatedGPU, original_to) -> list[tuple]:
    def to(tensor, *args, **kwargs):
        named, index = _target_of(gpu, kwargs.get("device", args[0] if args else None))
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

    return [
        (torch.Tensor, "to", to),
        (torch.Tensor, "cuda", cuda),
        (torch.Tensor, "pin_memory", pin_memory),
        (torch.Tensor, "is_pinned", lambda tensor, *args, **kwargs: id(tensor) in gpu._pinned),
        (torch.Tensor, "record_stream", record_stream),
    ]


def _clocks(gpu: SimulatedGPU) -> list[tuple]:
    clock = lambda: gpu.now  # noqa: E731
    return [
        (time, "perf_counter", clock),
        (time, "perf_counter_ns", lambda: int(gpu.now * 1e9)),
        (time, "monotonic", clock),
        (time, "monotonic_ns", lambda: int(gpu.now * 1e9)),
        (time, "time", lambda: 1.7e9 + gpu.now),
        (time, "time_ns", lambda: int((1.7e9 + gpu.now) * 1e9)),
    ]


def _target_of(gpu: SimulatedGPU, value):
    """(is a device named, index or None for the host) for a .to() argument; (False, None) for a dtype..."""
    if isinstance(value, torch.Tensor):
        tracked = gpu._tensors.get(id(value))
        if tracked is not None:
            return True, tracked.device
        return True, None
    if isinstance(value, (str, torch.device)) or (isinstance(value, int) and not isinstance(value, bool)):
        try:
            device = torch.device(value) if not isinstance(value, int) else torch.device("cuda", value)
        except (RuntimeError, TypeError):
            return False, None
        return True, (gpu._index(device) if device.type == "cuda" else None)
    return False, None


# ------------------------------------------------------------------ every other torch call: the mode


class _Mode(TorchFunctionMode):
    """Follows torch calls on device tensors (see torch_function)."""

    def __init__(self, gpu):
        super().__init__()
        self.gpu = gpu

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        return torch_function(self.gpu, func, args, kwargs or {})


def torch_function(gpu: SimulatedGPU, func, args, kwargs):
    """A torch call while the simulation runs: a Tensor property, a factory on a device, a read of values on the
    host, an op on device tensors (a kernel), or, touching no device tensor, the call itself."""
    name = getattr(func, "__name__", "")
    if isinstance(getattr(func, "__self__", None), types.GetSetDescriptorType):  # a property of Tensor
        return _property(gpu, func, name, args, kwargs)
    if name == "get_device" and args and id(args[0]) in gpu._tensors:
        return gpu._tensors[id(args[0])].device
    device = kwargs.get("device")
    if device is not None and isinstance(device, (str, torch.device, int)) and not isinstance(device, bool):
        target = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if target.type == "cuda":  # a factory: torch.zeros(..., device="cuda:1")
            return _factory(gpu, func, name, args, kwargs, gpu._index(target))
    flat = tree_flatten((args, kwargs))[0]
    tensors = [t for t in flat if isinstance(t, torch.Tensor)]
    tracked = {id(t): gpu._tensors[id(t)] for t in tensors if id(t) in gpu._tensors}
    if name in _HOST_READS and tensors:
        return _host_read(gpu, func, name, args, kwargs, tensors, tracked)
    if not tracked:
        return func(*args, **kwargs)
    return _device_op(gpu, func, name, args, kwargs, tensors, tracked)


def _property(gpu: SimulatedGPU, func, name: str, args, kwargs):
    """x.device is cuda:i (and is_cuda True) for a device tensor; p.data = t (module.to()) moves p where t is."""
    attribute, tensor = func.__self__.__name__, args[0] if args else None
    tracked = gpu._tensors.get(id(tensor))
    if name == "__get__" and tracked is not None:
        if attribute == "device":
            return torch.device("cuda", tracked.device)
        if attribute == "is_cuda":
            return True
        if attribute == "is_cpu":
            return False
    result = func(*args, **kwargs)
    if name == "__set__" and attribute == "data" and id(args[1]) in gpu._tensors:  # module.to(): p.data = t
        source = gpu._tensors[id(args[1])]
        gpu._track(tensor, _DeviceTensor(None, source.ready, source.name, source.device))
    return result


def _factory(gpu: SimulatedGPU, func, name: str, args, kwargs, index: int):
    """torch.zeros(..., device="cuda:1"): made on the host, tracked as the output of a kernel on device `index`."""
    kwargs = {key: value for key, value in kwargs.items() if key != "pin_memory"}
    result = func(*args, **{**kwargs, "device": "cpu"})
    span = gpu._run_kernel(index, gpu.op_seconds, name, [])
    for out in tree_flatten(result)[0]:
        if isinstance(out, torch.Tensor):
            gpu._track(out, _DeviceTensor(None, span.end, f"{name}(device='cuda:{index}')", index))
    return result


def _host_read(gpu: SimulatedGPU, func, name: str, args, kwargs, tensors, tracked):
    """item(), print(x), torch.equal...: a blocking device-to-host copy of each device tensor read; numpy() raises."""
    for t in tensors:
        _check_host_read(gpu, t, f"{name}()")
    if tracked:
        first = next(t for t in tensors if id(t) in tracked)
        if name == "numpy" or name == "__array__":
            raise TypeError(f"can't convert cuda:{tracked[id(first)].device} device type tensor to numpy. "
                            "Use Tensor.cpu() to copy the tensor to host memory first.")
        if name == "cpu":
            return gpu._to_host(first, False, why="Tensor.cpu()")
        for t in tensors:
            if id(t) in tracked:
                gpu._to_host(t, False, why=f"Tensor.{name}() reads a device tensor")
        with torch._C.DisableTorchFunction():
            return func(*args, **kwargs)
    return func(*args, **kwargs)


def _check_host_read(gpu: SimulatedGPU, tensor, what: str) -> None:
    pending = gpu._pending_host.get(id(tensor))
    if pending is not None and pending[0] > gpu.now + _EPS:
        gpu.problems.append(
            f"read before ready: {what} at {gpu.now:.4g} s reads a CPU tensor filled by a non-blocking "
            f"{pending[1]}, which ends at {pending[0]:.4g} s: synchronize (or read the device tensor) first")


def _device_op(gpu: SimulatedGPU, func, name: str, args, kwargs, tensors, tracked):
    """An op on device tensors: a kernel on the current stream of their one device, its new outputs tracked."""
    indices = sorted({entry.device for entry in tracked.values()})
    if len(indices) > 1:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"cuda:{indices[0]} and cuda:{indices[1]}! (in {name})")
    index = indices[0]
    if name == "copy_" and args and id(args[0]) not in tracked:  # a device-to-host copy into a CPU tensor
        return _copy_to_host(gpu, args, kwargs)
    inplace = name.endswith("_") and not name.endswith("__") or name in _INPLACE_OPERATORS
    if inplace and args and isinstance(args[0], torch.Tensor) and id(args[0]) not in tracked:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"cuda:{index} and cpu! (in {name}: an in-place op on a CPU tensor with a device "
                           "tensor)")
    result = func(*args, **kwargs)
    outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
    if not outputs:
        return result  # metadata: size, dim, dtype...
    storages = {_storage(t) for t in tensors if id(t) in tracked}
    new = [t for t in outputs if id(t) not in tracked and _storage(t) not in storages]
    written = [t for t in outputs if id(t) in tracked and inplace]
    if new or written or name == "copy_":
        span = gpu._run_kernel(index, gpu.op_seconds, name, list(tracked.values()))
        for t in written:
            gpu._tensors[id(t)].ready = span.end
        for t in new:
            gpu._track(t, _DeviceTensor(None, span.end, f"the output of {name}", index))
    for t in outputs:  # views share their base's memory and readiness
        if id(t) not in gpu._tensors:
            base = next((tracked[id(t2)] for t2 in tensors
                         if id(t2) in tracked and _storage(t2) == _storage(t)), None)
            if base is not None:
                gpu._track(t, _DeviceTensor(None, base.ready, base.name, index))
    return result


def _copy_to_host(gpu: SimulatedGPU, args, kwargs):
    destination, source = args[0], args[1]
    non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
    copied = gpu._to_host(source, non_blocking)
    with torch._C.DisableTorchFunction():
        destination.copy_(copied)
    if non_blocking:
        gpu._pending_host[id(destination)] = gpu._pending_host.get(id(copied))
        weakref.finalize(destination, gpu._pending_host.pop, id(destination), None)
    return destination


def _storage(t) -> int:
    with torch._C.DisableTorchFunction():
        return t.untyped_storage().data_ptr()
