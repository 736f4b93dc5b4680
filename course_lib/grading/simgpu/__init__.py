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
0 dimensions mixed with a device tensor in an out-of-place op (allowed here, an error on CUDA); the device-generic
``torch.Stream``, ``torch.Event`` and ``torch.accelerator`` spellings. Exercise 02's docstrings list the calls to use.

The package, a concept a file:

    timeline.py   the timeline's pieces: devices and their engines, streams, events, spans, tracked tensors
    machine.py    SimulatedGPU: the host clock, queuing work, the caching allocator, copies, what went wrong
    standins.py   the torch.cuda, Tensor and time calls it stands in for, and the torch function mode
"""

from course_lib.grading.simgpu.machine import SimulatedGPU
from course_lib.grading.simgpu.timeline import Span

__all__ = ["SimulatedGPU", "Span"]
