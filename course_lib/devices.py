"""What hardware is here, which device to use, and how much GPU memory is in use (notebook 01 introduces them).

    hardware_report()        a HardwareReport: CPU cores, CUDA GPUs, MPS, distributed backends
    print_hardware_report()  the same as a small table, with what will be real here and what simulated
    pick_device()            cuda -> mps -> cpu, and a sentence saying why
    require_gpus(n, what)    True if n CUDA GPUs exist; else says why the cell is skipped (and what it
                             printed on a recorded GPU run) and returns False
    gpu_memory_report()      nvidia-smi-style memory per GPU, from inside Python

Where there is no CUDA GPU nothing here initialises CUDA; reading a GPU's name or properties does
(once per process, and it is needed to use the GPU anyway).
"""

from __future__ import annotations

import os
import platform
import textwrap
from dataclasses import dataclass, field

import torch

from course_lib.tables import plural

__all__ = [
    "GPUInfo",
    "HardwareReport",
    "cuda_gpu_count",
    "hardware_report",
    "print_hardware_report",
    "pick_device",
    "require_gpus",
    "gpu_memory_report",
]

GiB = 2**30
WIDTH = 100  # characters: a notebook's output area shows about 115 at 1280 px before it breaks lines mid-word


def _say(text: str) -> None:
    """Print `text` with each paragraph line folded at WIDTH characters, between words."""
    print("\n".join(textwrap.fill(line, WIDTH) if line else "" for line in text.splitlines()))


@dataclass(frozen=True)
class GPUInfo:
    """One CUDA GPU as PyTorch sees it (notebook 01)."""

    index: int
    name: str
    total_memory: int  # bytes
    capability: tuple[int, int]  # (major, minor), e.g. (9, 0) for H100
    sm_count: int  # streaming multiprocessors


@dataclass(frozen=True)
class HardwareReport:
    """What this machine offers PyTorch (notebook 01)."""

    cpu_cores: int  # cores this process may use
    cpu_name: str
    gpus: list[GPUInfo] = field(default_factory=list)
    mps: bool = False  # Apple-silicon GPU
    backends: dict[str, bool] = field(default_factory=dict)  # distributed backend -> available
    torch_version: str = torch.__version__
    cuda_build: str | None = None  # CUDA version torch was built with, None for a CPU-only build

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)


def usable_cores() -> int:
    """CPU cores this process may run on, which can be fewer than the machine has (notebook 01)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no CPU affinity
        return os.cpu_count() or 1


def cuda_gpu_count() -> int:
    """CUDA GPUs visible to this process; 0 without touching CUDA where there are none (notebook 01)."""
    # is_available() asks the CUDA runtime (cudaGetDeviceCount, which initialises the driver but creates no
    # context, and marks the process so that a forked child cannot use CUDA); it asks NVML instead only when
    # PYTORCH_NVML_BASED_CUDA_CHECK=1 (torch/cuda/__init__.py: is_available, _nvml_based_avail).
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _distributed_backends() -> dict[str, bool]:
    import torch.distributed as dist

    if not dist.is_available():
        return {"nccl": False, "gloo": False, "mpi": False}
    return {"nccl": dist.is_nccl_available(), "gloo": dist.is_gloo_available(), "mpi": dist.is_mpi_available()}


def hardware_report() -> HardwareReport:
    """CPU cores, each CUDA GPU (name, memory, compute capability, SMs), MPS and distributed backends (notebook 01)."""
    gpus = []
    for i in range(cuda_gpu_count()):
        p = torch.cuda.get_device_properties(i)
        gpus.append(GPUInfo(i, p.name, p.total_memory, (p.major, p.minor), p.multi_processor_count))
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    return HardwareReport(
        cpu_cores=usable_cores(),
        cpu_name=platform.processor() or platform.machine(),
        gpus=gpus,
        mps=mps,
        backends=_distributed_backends(),
        cuda_build=torch.version.cuda,
    )


def _what_is_real(report: HardwareReport) -> list[str]:
    n = report.gpu_count
    if n == 0:
        lines = ["No CUDA GPU: GPU-only cells explain why and skip; they never make up a number."]
        if report.mps:
            lines.append("An Apple GPU (MPS) is here: single-device lessons can use it; distributed ones cannot.")
        lines.append("Distributed lessons run gloo ranks on the CPU: the same code and collectives, "
                     "but CPU speeds, not GPU or interconnect speeds.")
    elif n == 1:
        lines = ["1 CUDA GPU: single-GPU measurements are real.",
                 "Distributed lessons run gloo ranks on the CPU (NCCL needs one GPU per rank); "
                 "multi-GPU cells skip."]
    else:
        lines = [f"{plural(n, 'CUDA GPU')}: measurements are real; up to {plural(n, 'rank')} run on NCCL, "
                 "one GPU each."]
    if report.cuda_build is None:
        lines.append("This torch is a CPU-only build: install a CUDA build to use NVIDIA GPUs.")
    return lines


def print_hardware_report(report: HardwareReport | None = None) -> None:
    """Print the hardware report as a small table and say what will be real here and what simulated (notebook 01)."""
    from course_lib.tables import print_table

    report = report or hardware_report()
    print(f"CPU: {plural(report.cpu_cores, 'usable core')} ({report.cpu_name})")
    if report.gpus:
        rows = [(g.index, g.name, f"{g.total_memory / GiB:.1f}", f"{g.capability[0]}.{g.capability[1]}", g.sm_count)
                for g in report.gpus]
        print_table(["cuda", "name", "memory GiB", "capability", "SMs"], rows)
    else:
        print("CUDA GPUs: none")
    print(f"Apple MPS: {'available' if report.mps else 'no'}")
    backends = ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in report.backends.items())
    print(f"torch.distributed backends built in: {backends}")
    print()
    for line in _what_is_real(report):
        _say(line)


def pick_device() -> tuple[torch.device, str]:
    """The best single device here, cuda -> mps -> cpu, and a sentence saying why (notebook 01)."""
    n = cuda_gpu_count()
    if n:
        name = torch.cuda.get_device_name(0)
        which = "the only CUDA GPU" if n == 1 else f"the first of {plural(n, 'CUDA GPU')}"
        return torch.device("cuda", 0), f"cuda:0 ({name}), {which}"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps"), "mps: no CUDA GPU, but an Apple-silicon GPU is available"
    other = torch.accelerator.current_accelerator(check_available=True)  # e.g. an Intel XPU
    if other is not None:
        return torch.device(other.type, 0), f"{other.type}: no CUDA or Apple GPU, but a {other.type} accelerator is available"
    cores = usable_cores()
    return torch.device("cpu"), (f"cpu: no CUDA GPU or Apple GPU here, so the {plural(cores, 'CPU core')} "
                                 f"{'does' if cores == 1 else 'do'} the work")


def require_gpus(n: int, what: str, record: str | None = None) -> bool:
    """True if at least n CUDA GPUs exist; otherwise say plainly that the cell is skipped, and return False (notebook 01).

    With `record="01/pinned_copies"`: on a GPU, first print where the cell is measured; without one,
    show what the cell printed on a real GPU, labelled as recorded (course_lib.recorded).
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"require_gpus needs a whole number of GPUs, 1 or more, not {n!r}")
    have = cuda_gpu_count()
    if have >= n:
        if record:
            from course_lib.recorded import measured_here

            print(measured_here())
        return True
    _say(f"Skipped: this cell needs {plural(n, 'CUDA GPU')} and this machine has {have}.\n"
         f"On a GPU machine it runs as written, to {what}.")
    if record:
        from course_lib.recorded import show_recorded

        show_recorded(record)
    return False


def gpu_memory_report(devices: list[int] | None = None) -> list[dict]:
    """nvidia-smi-style memory per CUDA GPU: used/total from the driver, allocated/reserved by PyTorch (notebook 01).

    Prints a table and returns one dict per GPU (bytes). Without a CUDA GPU it says why there is
    nothing to report and returns [].
    """
    from course_lib.tables import print_table

    have = cuda_gpu_count()
    if have == 0:
        _say("No CUDA GPU here, so there is no GPU memory to report.\n"
             "On the CPU, tensors live in ordinary RAM: count their bytes with t.numel() * t.element_size().")
        return []
    rows, out = [], []
    for i in devices if devices is not None else range(have):
        free, total = torch.cuda.mem_get_info(i)  # what the driver sees: all processes, all allocators
        info = {
            "device": i,
            "name": torch.cuda.get_device_name(i),
            "used": total - free,
            "total": total,
            "allocated": torch.cuda.memory_allocated(i),  # live tensors of this process
            "reserved": torch.cuda.memory_reserved(i),  # held by PyTorch's caching allocator
            "peak_allocated": torch.cuda.max_memory_allocated(i),
        }
        out.append(info)
        rows.append((f"cuda:{i}", info["name"], f"{info['used'] / GiB:.2f} / {info['total'] / GiB:.1f}",
                     f"{info['allocated'] / GiB:.2f}", f"{info['reserved'] / GiB:.2f}",
                     f"{info['peak_allocated'] / GiB:.2f}"))
    print_table(["device", "name", "used / total GiB", "allocated GiB", "reserved GiB", "peak alloc GiB"], rows)
    return out
