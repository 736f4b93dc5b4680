"""Mixed precision's training step (notebook 06): fp32 against autocast bf16, and on CUDA TF32 and fp16 + GradScaler.

    python3 course.py python benchmarks/amp_step.py [--models mlp resnet18] [--repeats 10] [--warmup 3]

A benchmark, not a test: it prints a table of median step times on the device at hand (the first CUDA GPU, else
the CPU). One step is zero_grad, forward (under torch.autocast for bf16 and fp16) and loss, backward (of the scaled
loss with GradScaler), optimizer step (SGD with momentum; GradScaler's step and update for fp16). Models: "mlp", 4
Linear(width, width) layers with ReLU and an MSE loss; "resnet18", torchvision's ResNet-18 untrained (weights=None,
10 classes) on random images with cross-entropy. Parameters stay fp32 in every setting: autocast casts them per op.
Each setting trains its own copy of the model; after warm-up, the settings take turns step by step (in alternating
order, so that a noisy moment on a shared machine costs each alike) and the median over repeats is reported. CUDA
steps are timed with CUDA events around the step and a synchronize; peak memory is torch.cuda.max_memory_allocated
over one step (CPU: n/a, the caching allocator's statistics are CUDA's). On CUDA, "fp32" means IEEE fp32 matmuls
and convolutions and "fp32, TF32 math" lets tensor cores read them as TF32: torch.backends.cuda.matmul.fp32_precision
and torch.backends.cudnn.conv.fp32_precision "ieee" or "tf32" on torch 2.9 and later, the legacy flags
(matmul.allow_tf32, cudnn.allow_tf32) before; never both in one process, as reading a legacy flag after a new-API
write raises (pytorch/pytorch#179445, notebook 06).
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_lib.devices import usable_cores  # noqa: E402
from course_lib.tables import plural, print_table  # noqa: E402

MIB = 2**20
WIDTH = 100  # characters per printed line, as course_lib.devices folds them
# Sizes per device: small enough for 2 CPU cores to finish in well under a minute, large enough to keep a GPU busy.
SIZES = {"cpu": {"mlp": dict(width=1024, batch=128), "resnet18": dict(image=64, batch=8)},
         "cuda": {"mlp": dict(width=4096, batch=4096), "resnet18": dict(image=224, batch=128)}}


def _build(model_name: str, device, sizes: dict):
    """(model, inputs, loss function of the output), the same weights for every setting (seed 0)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    if model_name == "mlp":
        width, batch = sizes["width"], sizes["batch"]
        layers = []
        for _ in range(4):
            layers += [nn.Linear(width, width), nn.ReLU()]
        model = nn.Sequential(*layers[:-1])
        x = torch.randn(batch, width)
        target = torch.randn(batch, width, device=device)
        return model.to(device), x.to(device), lambda out: F.mse_loss(out.float(), target)
    import torchvision

    model = torchvision.models.resnet18(weights=None, num_classes=10)
    x = torch.randn(sizes["batch"], 3, sizes["image"], sizes["image"])
    labels = torch.randint(0, 10, (sizes["batch"],), device=device)
    if device.type == "cuda":
        model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    return model.to(device), x.to(device), lambda out: F.cross_entropy(out.float(), labels)


def _settings(device) -> list[tuple[str, object, bool, bool]]:
    """(label, autocast dtype or None, GradScaler?, TF32 allowed?) for each setting timed on this device."""
    import torch

    if device.type == "cuda":
        return [("fp32", None, False, False), ("fp32, TF32 math", None, False, True),
                ("bf16 autocast", torch.bfloat16, False, False),
                ("fp16 autocast + GradScaler", torch.float16, True, False)]
    return [("fp32", None, False, False), ("bf16 autocast", torch.bfloat16, False, False)]


def _set_tf32(device, allowed: bool) -> None:
    import torch

    if device.type != "cuda":
        return
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    if hasattr(matmul, "fp32_precision"):  # torch 2.9 and later: the per-op switches only
        matmul.fp32_precision = cudnn.conv.fp32_precision = "tf32" if allowed else "ieee"
    else:
        matmul.allow_tf32 = cudnn.allow_tf32 = allowed


class _Setting:
    """One setting's model, optimizer, scaler and step."""

    def __init__(self, label, dtype, use_scaler, tf32, model_name, device, sizes):
        import torch

        self.label, self.dtype, self.tf32, self.device = label, dtype, tf32, device
        self.model, self.x, self.loss_of = _build(model_name, device, sizes)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        self.scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)
        self.times: list[float] = []
        self.peak: int | None = None

    def step(self) -> None:
        import torch

        _set_tf32(self.device, self.tf32)
        self.optimizer.zero_grad(set_to_none=True)
        autocast = (torch.autocast(self.device.type, dtype=self.dtype) if self.dtype is not None
                    else contextlib.nullcontext())
        with autocast:
            loss = self.loss_of(self.model(self.x))
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def timed_step(self) -> float:
        import torch

        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(self.device)
            start.record()
            self.step()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        self.step()
        return time.perf_counter() - t0

    def measure_peak(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.step()
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)


def _say(text: str) -> None:
    print(textwrap.fill(text, WIDTH))


def _cpu_note() -> str:
    """Why bf16 autocast may not pay on this CPU, with what torch reports about it."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    probes = {"AVX512-BF16": "_is_avx512_bf16_supported", "AMX": "_is_amx_tile_supported"}
    found = []
    for name, probe in probes.items():  # private probes: present in torch 2.11-2.14, absent perhaps later
        check = getattr(torch.cpu, probe, None)
        found.append(f"{name} {'yes' if check and check() else 'no' if check else 'unknown'}")
    return (f"On the CPU, bf16 autocast may be slower than fp32: autocast casts every weight and activation it "
            f"feeds to a matmul (extra memory traffic), and bf16 matmuls are fast only where the CPU has bf16 units. "
            f"This CPU: torch.backends.cpu.get_cpu_capability() is {capability}; {', '.join(found)} "
            f"(torch.cpu's probes); oneDNN (mkldnn) {'on' if torch.backends.mkldnn.is_available() else 'off'}.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=["mlp", "resnet18"], default=["mlp", "resnet18"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    options = parser.parse_args(argv)
    if options.repeats < 1 or options.warmup < 1:
        parser.error("--repeats and --warmup must be 1 or more")

    import torch

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        where = f"cuda:0 ({torch.cuda.get_device_name(0)}), CUDA {torch.version.cuda}"
    else:
        where = f"the CPU ({plural(usable_cores(), 'usable core')}, {platform.processor() or platform.machine()})"
    _say(f"One training step (forward, backward, optimizer step) per precision: median of "
         f"{plural(options.repeats, 'step')} after {options.warmup} warm-up, the settings taking turns.")
    _say(f"Device: {where}; torch {torch.__version__}, Python {platform.python_version()}")
    rows = []
    for model_name in options.models:
        sizes = SIZES[device.type][model_name]
        shape = (f"width {sizes['width']}, batch {sizes['batch']}" if model_name == "mlp"
                 else f"{sizes['image']}x{sizes['image']} images, batch {sizes['batch']}")
        settings = [_Setting(*s, model_name, device, sizes) for s in _settings(device)]
        for setting in settings:
            for _ in range(options.warmup):
                setting.step()
            setting.measure_peak()
        for i in range(options.repeats):
            for setting in settings if i % 2 == 0 else reversed(settings):
                setting.times.append(setting.timed_step())
        baseline = statistics.median(settings[0].times)
        for setting in settings:
            median = statistics.median(setting.times)
            rows.append([f"{model_name} ({shape})", setting.label, f"{median * 1e3:.1f}", f"{baseline / median:.2f}x",
                         f"{setting.peak / MIB:.0f}" if setting.peak is not None else "n/a"])
        del settings
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print_table(["model", "precision", "median step ms", "speed vs fp32", "peak memory MiB"], rows)
    if device.type == "cpu":
        _say(_cpu_note())
    else:
        _say("On a GPU with tensor cores, bf16 and fp16 matmuls run at several times fp32's rate; a step gains "
              "less, as only part of it is matmuls (Amdahl: course_lib.precision.amdahl_speedup).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
