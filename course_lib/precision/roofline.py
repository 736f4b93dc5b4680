"""What lower precision buys on a GPU, from its published peaks: a matmul's roofline, Amdahl's law (notebook 06).

    GPUPeaks, GPU_PEAKS                an H100 SXM's published dense TFLOP/s per format and memory bandwidth
    roofline_time(flops, bytes, fmt)   max(compute time, memory time) at those peaks: a lower bound
    matmul_prediction(n, fmt)          an n×n×n matmul's predicted time, TFLOP/s and bound (compute or memory)
    amdahl_speedup(fraction, speedup)  the whole step's speedup when only its matmuls go faster

The GPU figures are published peaks, not measurements (benchmarks/amp_step.py measures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from course_lib.precision._checks import _count, _finite, _real
from course_lib.precision.formats import _format

__all__ = ["GPUPeaks", "GPU_PEAKS", "roofline_time", "MatmulPrediction", "matmul_prediction", "amdahl_speedup"]


@dataclass(frozen=True)
class GPUPeaks:
    """A GPU's published peaks: dense TFLOP/s per format and memory bandwidth, with sources (notebook 06).

    tflops maps format names (keys of FORMATS) to dense peak TFLOP/s (10^12 FLOP/s, no 2:4 sparsity);
    GPU_PEAKS["bf16"] reads one. bandwidth_TBps: memory bandwidth in TB/s (10^12 bytes per second).
    """

    name: str
    tflops: Mapping[str, float]
    bandwidth_TBps: float
    source: str

    def __post_init__(self):
        object.__setattr__(self, "tflops", MappingProxyType(dict(self.tflops)))  # read-only, as the rest
        for fmt, value in self.tflops.items():
            _format(fmt)
            if not (_finite(value) and value > 0):
                raise ValueError(f"{self.name}: peak for {fmt} must be a finite number of TFLOP/s > 0, not {value!r}")
        if not (_finite(self.bandwidth_TBps) and self.bandwidth_TBps > 0):
            raise ValueError(f"{self.name}: bandwidth_TBps must be a finite number > 0, not {self.bandwidth_TBps!r}")

    def __getitem__(self, fmt: str) -> float:
        name = _format(fmt).name
        if name not in self.tflops:
            raise ValueError(f"{self.name} has no published peak for {name}: it has {', '.join(self.tflops)}")
        return self.tflops[name]

    def flops_per_s(self, fmt: str) -> float:
        """The dense peak of the format in FLOP/s."""
        return self[fmt] * 1e12

    @property
    def bandwidth_Bps(self) -> float:
        return self.bandwidth_TBps * 1e12


# Dense (no sparsity) peaks of an H100 SXM5: https://glennklockwood.com/garden/processors/h100 (its table of
# theoretical TFLOPS). NVIDIA's H100 datasheet prints the tensor-core figures "with sparsity", exactly 2x these (1,979
# for BF16/FP16, 3,958 for FP8; archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html). FP32 66.9: no tensor cores.
# Bandwidth 3.35 TB/s (HBM3, 80 GB): NVIDIA's H100 product page (www.nvidia.com/en-us/data-center/h100/), its
# specifications table, H100 SXM column: "GPU Memory 80GB", "GPU Memory Bandwidth 3.35TB/s" (H100 NVL: 94GB, 3.9TB/s),
# read through public repositories that quote the table word for word (the page itself was not fetched for this
# course). The H200 (notebook 06's records) is the same chip with "GPU Memory 141GB", "GPU Memory Bandwidth 4.8TB/s"
# (www.nvidia.com/en-us/data-center/h200/, quoted the same way).
GPU_PEAKS = GPUPeaks(
    "H100 SXM",
    {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8 e4m3": 1978.9, "fp8 e5m2": 1978.9},
    3.35,
    "dense TFLOP/s: glennklockwood.com/garden/processors/h100 (NVIDIA's datasheet lists 2x, 'with sparsity'); "
    "3.35 TB/s: NVIDIA's H100 product page, specifications table (H100 SXM)",
)


def roofline_time(flops: float, bytes_moved: float, fmt: str, peaks: GPUPeaks = GPU_PEAKS) -> float:
    """Seconds for work of `flops` FLOPs moving `bytes_moved` bytes, at the peaks: the roofline (notebook 06).

    max(flops / peak FLOP/s of fmt, bytes_moved / bandwidth): whichever the work runs out of first. A lower bound;
    real kernels reach perhaps 60–80% of either peak.
    """
    if not isinstance(peaks, GPUPeaks):
        raise TypeError(f"peaks must be a GPUPeaks such as GPU_PEAKS, not {type(peaks).__name__}")
    for name, v in (("flops", flops), ("bytes_moved", bytes_moved)):
        if not (_finite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, not {v!r}")
    return max(flops / peaks.flops_per_s(fmt), bytes_moved / peaks.bandwidth_Bps)


@dataclass(frozen=True)
class MatmulPrediction:
    """The roofline's prediction for an n×n by n×n matmul in one format (notebook 06)."""

    n: int
    fmt: str
    flops: float  # 2n³
    bytes_moved: float  # 3n² elements: read A and B, write C, each once
    seconds: float
    bound: str  # "compute" or "memory"

    @property
    def tflops(self) -> float:
        """Achieved TFLOP/s: flops / seconds / 10^12."""
        return self.flops / self.seconds / 1e12

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved: 2n³ / (3n² · element size) = 2n / (3 · element size)."""
        return self.flops / self.bytes_moved


def matmul_prediction(n: int, fmt: str, peaks: GPUPeaks = GPU_PEAKS) -> MatmulPrediction:
    """Predicted time of an n×n×n matmul in fmt on the peaks' GPU: 2n³ FLOPs, 3n² elements moved (notebook 06).

    Each matrix crosses memory once at the format's storage size (tf32: 4 bytes, it is stored as fp32), output in
    the same format. Small n is memory-bound; above n ≈ 1.5 · peak / bandwidth · element size, compute-bound.
    """
    n = _count(n, "n")
    if n < 1:
        raise ValueError(f"n must be 1 or more, not {n}")
    f = _format(fmt)
    flops = 2.0 * n**3
    bytes_moved = 3.0 * n**2 * f.storage_bytes
    seconds = roofline_time(flops, bytes_moved, f.name, peaks)
    bound = "compute" if flops / peaks.flops_per_s(f.name) >= bytes_moved / peaks.bandwidth_Bps else "memory"
    return MatmulPrediction(n, f.name, flops, bytes_moved, seconds, bound)


def amdahl_speedup(fraction_sped_up: float, speedup: float) -> float:
    """The whole step's speedup when a fraction of its time goes `speedup` times faster: Amdahl's law (notebook 06).

    1 / ((1 − f) + f / s). With matmuls 70% of a step and 2x faster in bf16, the step is 1 / (0.3 + 0.35) ≈ 1.54x
    faster; however fast the matmuls, never more than 1 / 0.3 ≈ 3.3x.
    """
    if not (_finite(fraction_sped_up) and 0 <= fraction_sped_up <= 1):
        raise ValueError(f"fraction_sped_up must be a number in [0, 1], not {fraction_sped_up!r}")
    if not (_real(speedup) and speedup > 0 and not math.isnan(speedup)):
        raise ValueError(f"speedup must be a number > 0, not {speedup!r}")
    remaining = (1.0 - fraction_sped_up) + fraction_sped_up / speedup
    return math.inf if remaining == 0 else 1.0 / remaining
