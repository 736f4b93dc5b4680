"""nn.DataParallel's training step, made by hand on any list of devices: CUDA GPUs, or CPU stand-ins (notebook 03).

    replica_devices(n)                    n CUDA GPUs where there are enough, else n CPU stand-ins, and a sentence
    parallel_apply(functions, inputs)     functions[i](*inputs[i]), each in a thread of its own; results in order;
                                          the caller's grad mode, autocast, device and stream carried in
    DataParallelByHand(module, devices)   scatter, replicate, parallel_apply, gather; backward; an explicit reduce
    PhaseTimer(devices)                   wall-clock seconds per named phase of a step
    chunk_sizes(batch_size, n)            the chunk sizes DataParallel gives n devices (torch.chunk's)
    step_picture(batch_size, n)           the picture of one DataParallel step

DataParallelByHand is the *explicit* version: one tensor in, one tensor out, independent copies of the module
(copy.deepcopy) and an explicit sum of their gradients. torch.nn.DataParallel (torch/nn/parallel/) gets the
same sum from autograd instead (Broadcast's backward is ReduceAddCoalesced) and splits nested inputs; exercise 03
builds that version, so nothing here is its answer.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Sequence

import torch
from torch import nn

from course_lib.tables import plural

__all__ = ["replica_devices", "parallel_apply", "DataParallelByHand", "PhaseTimer", "chunk_sizes", "step_picture"]


def replica_devices(n: int) -> tuple[list[torch.device], str]:
    """`n` devices for `n` replicas: cuda:0..n-1 where there are enough CUDA GPUs, else n CPU stand-ins (notebook 03)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"need a whole number of replicas, 1 or more, not {n!r}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= n:
        on = "CUDA GPU 0" if n == 1 else f"CUDA GPUs 0 to {n - 1}"
        return [torch.device("cuda", i) for i in range(n)], f"{plural(n, 'replica')} on {on}"
    why = f"only {plural(gpus, 'CUDA GPU')}" if gpus else "no CUDA GPU"
    return [torch.device("cpu")] * n, f"{plural(n, 'replica')} on the CPU ({why}): threads stand in for GPUs"


def _first_tensor(obj: Any) -> torch.Tensor | None:
    """The first tensor in a nested input, as torch's get_a_var finds it (the device a replica runs on)."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, Mapping):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for value in obj:
            found = _first_tensor(value)
            if found is not None:
                return found
    return None


def _autocast_states() -> list[tuple[str, bool, torch.dtype, bool]]:
    """The caller's autocast for the CPU and for the accelerator, if there is one: (type, enabled, dtype, cache)."""
    types = ["cpu"]
    if torch.accelerator.is_available():
        types.append(torch.accelerator.current_accelerator().type)
    cache = torch.is_autocast_cache_enabled()
    return [(kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind), cache) for kind in types]


def parallel_apply(functions: Sequence[Callable[..., Any]], inputs: Sequence[Any],
                   devices: Sequence[torch.device | str | int | None] | None = None) -> list[Any]:
    """Call functions[i](*inputs[i]) for every i, each in a thread of its own; return the results in order (notebook 03).

    What torch.nn.parallel.parallel_apply does for replicas on GPUs: results are kept by index, not in the order
    the threads finish; an exception in a thread is re-raised here, naming the replica (uncaught, it would only end
    its own thread). A new thread starts with torch's per-thread settings at their defaults, so the caller's are
    carried into each thread, as torch does:
    - grad mode (torch.no_grad in the caller means no graph in the replicas either);
    - autocast, for the CPU and for the accelerator, with its dtype (torch carries only whether it is on, for the
      accelerator): without this, a step under torch.autocast would silently run its replicas in fp32 (lesson 06);
    - on an accelerator (CUDA), the device: replica i runs with devices[i] (by default the device of the first
      tensor in inputs[i], else the caller's current one) as its current device, and on the stream that is
      current for that device in the caller's thread (captured before the threads start, since current streams
      are per thread), so that its kernels are ordered after the caller's work on that stream;
    - the number of intra-op threads, which matters on the CPU: a new thread does not inherit torch.set_num_threads
      (MKL keeps it per thread); torch does not carry it.
    An input that is not a tuple or a list is passed as the only argument.
    """
    if len(functions) != len(inputs):
        raise ValueError(f"{plural(len(functions), 'function')} but {plural(len(inputs), 'input')}")
    if devices is not None and len(devices) != len(functions):
        raise ValueError(f"{plural(len(functions), 'function')} but {plural(len(devices), 'device')}")
    grad_enabled, intra_op_threads = torch.is_grad_enabled(), torch.get_num_threads()
    autocast = _autocast_states()
    # Where an accelerator exists: each replica's device index and the caller's current stream on it, read here,
    # in the caller's thread (a new thread's current stream is the default one, not the caller's).
    places: list[tuple[int, Any] | None] = [None] * len(functions)
    if torch.accelerator.is_available():
        kind = torch.accelerator.current_accelerator().type
        for i in range(len(functions)):
            device = devices[i] if devices is not None and devices[i] is not None else None
            if device is None:
                tensor = _first_tensor(inputs[i])
                device = tensor.device if tensor is not None else None
            device = torch.device(device) if isinstance(device, str) else device
            if isinstance(device, torch.device):
                index = device.index if device.type == kind else None
            else:
                index = device  # an int, or None
            if index is None:
                index = torch.accelerator.current_device_index()  # a CPU replica keeps the caller's current device
            places[i] = (index, torch.accelerator.current_stream(index))
    results: list[Any] = [None] * len(functions)
    errors: list[BaseException | None] = [None] * len(functions)

    def work(i: int) -> None:
        torch.set_grad_enabled(grad_enabled)  # a new thread starts with grad mode on, whatever the caller's
        torch.set_num_threads(intra_op_threads)  # and with the default number of intra-op threads
        try:
            with ExitStack() as settings:
                for kind, enabled, dtype, cache in autocast:  # and with autocast off
                    settings.enter_context(torch.autocast(kind, dtype=dtype, enabled=enabled, cache_enabled=cache))
                if places[i] is not None:
                    index, stream = places[i]
                    settings.enter_context(torch.accelerator.device_index(index))
                    settings.enter_context(stream)  # torch.Stream as a context: current on its device
                args = inputs[i] if isinstance(inputs[i], (tuple, list)) else (inputs[i],)
                results[i] = functions[i](*args)
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread below
            errors[i] = error

    if len(functions) == 1:
        work(0)  # as torch does: one replica runs in the calling thread
    else:
        threads = [threading.Thread(target=work, args=(i,), name=f"replica-{i}") for i in range(len(functions))]
        for thread in threads:
            thread.start()  # all started before any is joined: they run side by side
        for thread in threads:
            thread.join()
    for i, error in enumerate(errors):
        if error is not None:
            raise RuntimeError(f"replica {i} failed: {type(error).__name__}: {error}") from error
    return results


class PhaseTimer:
    """Wall-clock seconds per named phase, summed until cleared; CUDA devices are synchronised at each edge (notebook 03)."""

    def __init__(self, devices: Sequence[torch.device | str] = ()):
        self.cuda = sorted({torch.device(d).index or 0 for d in devices if torch.device(d).type == "cuda"})
        self.seconds: dict[str, float] = defaultdict(float)

    def _sync(self) -> None:
        for index in self.cuda:
            torch.cuda.synchronize(index)  # GPU work is asynchronous: wait for it, or the time lands in a later phase

    @contextmanager
    def __call__(self, phase: str):
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[phase] += time.perf_counter() - start


class DataParallelByHand(nn.Module):
    """nn.DataParallel's step with every part explicit: scatter, replicate, parallel_apply, gather, reduce (notebook 03).

        dp = DataParallelByHand(model, devices)   # model on devices[0]
        loss = loss_fn(dp(x), y)                  # x split over the devices; the output gathered on devices[0]
        dp.backward(loss)                         # each replica's backward in a thread of its own
        dp.reduce_gradients()                     # the replicas' gradients summed into model's .grad
        optimizer.step()                          # an optimizer over model.parameters(), on devices[0] only

    As in DataParallel, the model is copied afresh on every call, replica 0's buffers end up in `model`
    (BatchNorm's running statistics come from the first chunk alone), anything else a replica changes is lost,
    and state_dict keys start with "module.". `timer` collects the seconds of each phase.
    """

    def __init__(self, module: nn.Module, devices: Sequence[torch.device | str], timer: PhaseTimer | None = None):
        super().__init__()
        if not devices:
            raise ValueError("DataParallelByHand needs at least one device")
        self.module = module  # a submodule, so state_dict keys start with "module.", as DataParallel's do
        self.devices = [torch.device(d) for d in devices]
        self.timer = timer or PhaseTimer(self.devices)
        self._replicas: list[nn.Module] = []
        self._outputs: list[torch.Tensor] = []

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        """Scatter the batch (torch.chunk), replicate the module, run the replicas in threads, gather the outputs."""
        t = self.timer
        with t("scatter"):  # torch.chunk's sizes, as DataParallel's scatter (maybe fewer chunks than devices)
            chunks = [chunk.to(d) for chunk, d in zip(batch.chunk(len(self.devices)), self.devices)]
        with t("replicate"):  # a fresh copy per used device, on every call
            self._replicas = [self._copy_to(d) for d in self.devices[: len(chunks)]]
        with t("forward"):
            self._outputs = parallel_apply(self._replicas, chunks)
        with t("replica 0 buffers"):  # DataParallel's replica 0 shares the module's buffers; here they are copied back
            with torch.no_grad():
                for mine, theirs in zip(self.module.buffers(), self._replicas[0].buffers()):
                    mine.copy_(theirs)
        with t("gather"):
            return torch.cat([out.to(self.devices[0]) for out in self._outputs])

    def _copy_to(self, device: torch.device) -> nn.Module:
        with torch.no_grad():
            replica = copy.deepcopy(self.module).to(device)
        replica.zero_grad(set_to_none=True)  # deepcopy copies .grad too; a replica starts with none
        return replica

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate `loss` into every replica, each replica's part in a thread of its own.

        On GPUs autograd runs each device's part of the graph in a thread of its own; on the CPU one backward
        runs in the calling thread, so the replicas' parts would run one after the other. So: first the
        gradient of the loss with respect to each replica's output (what DataParallel's Gather sends back to
        each GPU), then each replica's backward from its own thread.
        """
        with self.timer("backward"):
            grads = torch.autograd.grad(loss, self._outputs)
            parallel_apply([torch.autograd.backward] * len(grads), list(zip(self._outputs, grads)))

    def reduce_gradients(self) -> None:
        """Set each parameter's .grad to the sum of the replicas' gradients (a sum: the loss was one, over the batch)."""
        with self.timer("reduce"):
            named = [dict(replica.named_parameters()) for replica in self._replicas]
            with torch.no_grad():
                for name, param in self.module.named_parameters():
                    total = None  # replaces, never adds to, an old .grad
                    for copies in named:
                        part = copies[name].grad
                        if part is not None:
                            total = part.to(param.device) if total is None else total + part.to(param.device)
                    param.grad = total
        self._replicas, self._outputs = [], []  # the copies are garbage now, as DataParallel's are after each step


def chunk_sizes(batch_size: int, n_devices: int) -> list[int]:
    """The chunk sizes DataParallel gives `n_devices` devices for a batch of `batch_size`: torch.chunk's (notebook 03)."""
    return [len(c) for c in torch.empty(batch_size, device="meta").chunk(n_devices)] if batch_size else []


def step_picture(batch_size: int = 10, n_devices: int = 4, ax=None):
    """Picture of one nn.DataParallel training step: what each device holds and what moves, phase by phase (notebook 03)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    sizes = chunk_sizes(batch_size, n_devices)
    used = len(sizes)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.9 + 1.75 * n_devices, 6.2))
    phases = ["1 scatter the batch\n(torch.chunk, dim 0)", "2 replicate the module\n(broadcast, every step)",
              "3 parallel_apply\n(one thread per replica)", "4 gather outputs on\ndevice 0; loss there",
              "5 backward: output grads\nscattered, each replica", "6 reduce-add gradients\non device 0; step"]
    colours = plt.cm.tab10.colors
    width, height = 1.3, 0.62
    for row, label in enumerate(phases):
        y = len(phases) - 1 - row
        ax.text(-0.85, y, label, ha="right", va="center", fontsize=8.5)
        for d in range(n_devices):
            idle = d >= used
            face = "#f1f1f1" if idle else ("#fff3c4" if d == 0 else "#e8f0fb")
            ax.add_patch(Rectangle((d * 1.75 - width / 2, y - height / 2), width, height, facecolor=face,
                                   edgecolor="#999999" if idle else "#333333", lw=0.8))
            if idle:
                ax.text(d * 1.75, y, "idle", ha="center", va="center", fontsize=8, color="#888888")
                continue
            n = sizes[d]
            text = {0: plural(n, "sample"), 1: "params\n(shared)" if d == 0 else "params\ncopy",
                    2: f"forward({n})", 3: "outputs\n+ loss" if d == 0 else "output", 4: f"backward({n})",
                    5: "grads summed\noptimizer.step" if d == 0 else "grads"}[row]
            ax.text(d * 1.75, y, text, ha="center", va="center", fontsize=8,
                    color=colours[d % 10] if row in (0, 2, 4) else "black")
            if d > 0 and row in (0, 1, 3, 4, 5):
                outwards = row in (0, 1, 4)  # from device 0 to device d; the other rows move back to device 0
                if outwards:
                    start, end = (width / 2, y + 0.34), (d * 1.75 - width / 2, y + 0.34)
                else:
                    start, end = (d * 1.75 - width / 2, y - 0.34), (width / 2, y - 0.34)
                ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=8, lw=0.7,
                                             color=colours[d % 10], connectionstyle="arc3,rad=-0.08", alpha=0.8))
    for d in range(n_devices):
        ax.text(d * 1.75, len(phases) - 0.45, f"device {d}" + (" (output_device)" if d == 0 else ""), ha="center",
                va="bottom", fontsize=9, fontweight="bold" if d == 0 else "normal")
    ax.set_xlim(-3.4, (n_devices - 1) * 1.75 + 0.9)
    ax.set_ylim(-0.6, len(phases) - 0.1)
    ax.axis("off")
    title = f"One DataParallel step: batch {batch_size} over {plural(n_devices, 'device')}, chunks {sizes}"
    if used < n_devices:
        # "device(s)" stays: tests/course/parallel/test_data_parallel.py looks for "1 device(s) idle"
        title += f"\n{n_devices - used} device(s) idle: torch.chunk made only {plural(used, 'chunk')}"
    ax.set_title(title, fontsize=10)
    return ax
