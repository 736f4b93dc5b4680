"""Timing device work correctly: warm-up, CUDA events, repeats and robust statistics (notebook 01 introduces it)."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from course_lib.tables import plural, print_table

__all__ = ["Timing", "benchmark", "compare", "format_seconds", "quick", "QUICK_VARIABLE"]

QUICK_VARIABLE = "COURSE_QUICK"  # the course's tests set it to 1 in every kernel that runs a lesson


def quick() -> bool:
    """True when the course's tests run this lesson (COURSE_QUICK=1): use smaller sweeps, fewer repeats (any lesson).

    The same code runs either way; only sizes shrink, e.g. `sizes = [64, 256] if quick() else [64, 128, 256, 512]`.
    Unset, empty, "0", "false" or "no" mean a learner's full-size run.
    """
    return os.environ.get(QUICK_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


@dataclass
class Timing:
    """Repeated timings of one piece of work, in seconds (notebook 01)."""

    times: list[float] = field(default_factory=list)  # seconds, one per repeat
    device: str = "cpu"

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def max(self) -> float:
        return max(self.times)

    @property
    def iqr(self) -> float:
        """Spread of the middle half of the runs: robust to the odd slow run."""
        if len(self.times) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.times, n=4, method="inclusive")
        return q3 - q1

    @property
    def stdev(self) -> float:
        return statistics.stdev(self.times) if len(self.times) > 1 else 0.0

    def __str__(self) -> str:
        return (f"median {format_seconds(self.median)} (IQR {format_seconds(self.iqr)}, "
                f"min {format_seconds(self.min)}, max {format_seconds(self.max)}, {plural(len(self.times), 'run')} on {self.device})")


def format_seconds(seconds: float) -> str:
    """A duration with a readable unit: '2.83 ms', '11.8 µs' (notebook 01)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def _accelerator_available() -> bool:
    """True where a CUDA, XPU, MPS or other accelerator is present: work may then be queued, not done."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


NO_DEVICE = ("benchmark was given no device, and this machine has an accelerator ({kind}). Work queued there "
             "is asynchronous: a stopwatch that does not wait for the device times the launches, not the "
             "work. Say where fn runs: device='{kind}:0' (or the device it uses) for device work, "
             "device='cpu' for work that stays on the CPU, or a list of devices for work spread over several.")


def _resolve(device: Any) -> list:
    """The devices to time on: [] for the CPU, else torch.device objects; refuses a missing device where it matters."""
    import torch

    if device is None:
        if _accelerator_available():
            accelerator = getattr(torch, "accelerator", None)
            current = accelerator.current_accelerator() if accelerator is not None else None
            raise ValueError(NO_DEVICE.format(kind=current.type if current is not None else "cuda"))
        return []
    many = [device] if isinstance(device, (str, int, torch.device)) else list(device)
    if not many:
        raise ValueError("benchmark needs a device, or a non-empty list of devices, e.g. device='cuda:0'")
    resolved = []
    for d in many:
        d = torch.device(d)
        if d.type != "cpu":
            resolved.append(d)
    return resolved


def _synchronize(dev) -> None:
    import torch

    if dev.type == "meta":
        return  # shapes only: nothing ever runs
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    else:
        torch.accelerator.synchronize(dev)  # waits for that device, not only the current one


def benchmark(fn: Callable[[], Any], *, device: Any = None, warmup: int = 3, repeat: int = 20) -> Timing:
    """Time `fn()` correctly on `device`: warm-up runs first, CUDA events on a GPU, perf_counter on the CPU (notebook 01).

    GPU work is asynchronous: `fn()` returns when the kernels are queued, not done. So:

    * device="cuda:0" (one CUDA device): each run is bracketed by events recorded on that device's current
      stream, and the device is synchronised once, before the events are read (notebook 02 explains why);
    * another accelerator ("xpu:0", "mps"...): the device is synchronised before and after each run,
      around a perf_counter measurement;
    * a list of devices (["cuda:0", "cuda:1"]): every one of them is synchronised before and after each
      run, around a perf_counter measurement: for work spread over several devices (notebook 03);
    * device="cpu": perf_counter alone. device=None means the CPU only on a machine without an accelerator;
      where one is present, None raises ValueError, because `fn` may queue device work that a stopwatch
      would not wait for (the launch would be timed, not the work). Pass the device explicitly.
    """
    import torch

    if not callable(fn):
        raise TypeError(f"benchmark needs a function of no arguments, e.g. lambda: a @ b, not {type(fn).__name__}")
    if warmup < 0 or repeat < 1:
        raise ValueError(f"need warmup >= 0 and repeat >= 1, got warmup={warmup}, repeat={repeat}")
    devices = _resolve(device)
    events = len(devices) == 1 and devices[0].type == "cuda" and not isinstance(device, (list, tuple))
    for _ in range(warmup):  # first runs pay for allocation, kernel selection, caches
        fn()
    times = []
    if events:
        dev = devices[0]
        with torch.cuda.device(dev):  # events and the current stream of *that* device, not of cuda:0
            torch.cuda.synchronize(dev)
            pairs = []
            for _ in range(repeat):
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                pairs.append((start, stop))
            torch.cuda.synchronize(dev)  # events are only readable once the GPU has passed them
            times = [s.elapsed_time(e) / 1e3 for s, e in pairs]  # elapsed_time is in ms
    else:
        for _ in range(repeat):
            for dev in devices:
                _synchronize(dev)
            t0 = time.perf_counter()
            fn()
            for dev in devices:
                _synchronize(dev)
            times.append(time.perf_counter() - t0)
    label = devices[0].type if len(devices) == 1 else ", ".join(map(str, devices)) if devices else "cpu"
    return Timing(times=times, device=label)


def compare(cases: dict[str, Callable[[], Any]], *, device: Any = None, warmup: int = 3, repeat: int = 20,
            show: bool = True) -> dict[str, Timing]:
    """Benchmark several cases and print a table with each median's ratio to the first case's (notebook 01)."""
    if not cases:
        raise ValueError("compare needs at least one case, e.g. {'pinned': f, 'pageable': g}")
    results = {name: benchmark(fn, device=device, warmup=warmup, repeat=repeat) for name, fn in cases.items()}
    if show:
        base = next(iter(results.values())).median
        rows = [(name, format_seconds(t.median), format_seconds(t.iqr), format_seconds(t.min),
                 f"{t.median / base:.2f}×" if base > 0 else "–") for name, t in results.items()]
        print_table(["case", "median", "IQR", "min", "vs first"], rows)
    return results
