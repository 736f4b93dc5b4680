"""DistributedDataParallel's step as a model: links, the ring all-reduce, buckets, overlap, scaling (notebook 05).

    Link, LINKS                       a link's latency α and bus bandwidth, with where each figure comes from
    all_reduce_time(nbytes, n, link)  the ring all-reduce of lesson 04's α–β model, in the link's bus bandwidth
    fit_link(sizes, seconds, n)       a Link fitted to an all-reduce sweep (least squares on relative errors)
    parameter_bytes(model)            gradient bytes per trainable parameter, in registration order
    bucket_sizes(grad_bytes)          the bytes of each of DDP's buckets, in the order DDP fills them
    ddp_step_time(...)                one DDP step, its all-reduces overlapped with backward or after it
    bucket_schedule(...)              the same step as spans, to draw with streams.draw_timeline
    scaling_curve(...)                the step on 1, 2, 4, ... GPUs: per-GPU efficiency against GPU count
    MODELS                            gradient bytes per parameter of ResNet-18, ResNet-50 and a 1.3B GPT
    draw_ddp_step(...)                the scaling curve and the bucket timeline of one setting, drawn
    ddp_explorer(...)                 sliders and menus that redraw the scaling curve and the bucket timeline
    BACKWARD_FRACTION, DEFAULT_COMPUTE_MS   the model's two default figures, each with its source

Everything here is a model: it predicts and measures nothing (fit_link reads a sweep you measured). Exercise 05
builds DDP's buckets and hooks in real ranks (its own bucket assignment, which is not this module's bucket_sizes);
this module says how long such a step would take on links a laptop does not have, and why overlap and bucket
size matter there.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass
from typing import Mapping, Sequence

from course_lib.parallel.streams import Span, draw_timeline
from course_lib.sliders import log_slider
from course_lib.tables import plural

__all__ = ["Link", "LINKS", "all_reduce_time", "fit_link", "parameter_bytes", "bucket_sizes", "StepEstimate",
           "ddp_step_time", "bucket_schedule", "scaling_curve", "MODELS", "draw_ddp_step", "ddp_explorer",
           "BACKWARD_FRACTION", "DEFAULT_COMPUTE_MS"]

MIB = 2**20  # DDP's bucket_cap_mb is in MiB: int(bucket_cap_mb * 1024 * 1024) bytes (torch/nn/parallel/distributed.py)

# Backward's share of a training step's compute: backward costs about twice forward in FLOPs (a gradient with
# respect to the inputs and one with respect to the weights for every matmul), so 2 / (1 + 2). Kaplan et al. 2020,
# "Scaling Laws for Neural Language Models", arXiv:2001.08361, section 2.1: the backward pass is "approximately
# twice the compute as the forwards pass", hence C ≈ 6N FLOPs per token (2N forward, 4N backward); Narayanan et al.
# 2021 (Megatron-LM, SC'21, arXiv:2104.04473) count a backward pass as two forward passes too. An estimate in
# FLOPs, not a measured time: memory-bound layers (normalisation, activations) do not follow the ratio.
BACKWARD_FRACTION = 2 / 3

# The explorer's default compute per step: a ResNet-50 training step (batch 128, 224×224, channels-last, bf16
# autocast) measured at 34.5 ms on a lent H100 with torch 2.11.0+cu130, the course's own measurement, written down
# in its design notes (not a notebooks/recorded_on_gpu.json record). The same step recorded on an H200 with torch
# 2.11 is notebooks/recorded_on_gpu.json's "06/amp_step": 29.2 ms (lesson 06).
DEFAULT_COMPUTE_MS = 34.5


def _real(x) -> bool:
    """A finite real number (numpy's too), not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Link:
    """A link as the ring all-reduce sees it: latency per message and bus bandwidth, with sources (notebook 05).

    alpha_s: seconds per message (one step of the ring). bandwidth_Bps: bytes per second of *bus* bandwidth,
    nccl-tests' busbw (doc/PERFORMANCE.md in NVIDIA/nccl-tests: busbw = algbw · 2(n−1)/n for all-reduce), so a
    figure read off an all_reduce_perf run plugs straight in. source: where each figure comes from, or the words
    saying that it is an assumption. A ring that crosses several kinds of link goes at the pace of the slowest:
    model it with that one (across machines, the network).
    """

    name: str
    alpha_s: float
    bandwidth_Bps: float
    source: str

    def __post_init__(self):
        if not (_real(self.alpha_s) and self.alpha_s >= 0):
            raise ValueError(f"{self.name}: alpha_s must be a finite number of seconds >= 0, not {self.alpha_s!r}")
        if not (_real(self.bandwidth_Bps) and self.bandwidth_Bps > 0):
            raise ValueError(f"{self.name}: bandwidth_Bps must be a finite number of bytes/s > 0, "
                             f"not {self.bandwidth_Bps!r}")

    @property
    def summary(self) -> str:
        """One line: name, α in µs, bus bandwidth in GB/s (10⁹ bytes per second, as nccl-tests prints it)."""
        return f"{self.name}: α {self.alpha_s * 1e6:.3g} µs, busbw {self.bandwidth_Bps / 1e9:.3g} GB/s"


_NVLINK_ALPHA = ("α assumed 2.5 µs per ring step, not measured on this link: it is the α that fit_link gives for "
                 "the 8×A100 NVLink run in course_lib/nccl_logs.py (ONE_MACHINE), the only small-message log at hand")
_NETWORK_ALPHA = "α assumed 10 µs per message, an order of magnitude for a hop between machines; not measured"

# Every figure is sourced or labelled an assumption, in its Link's `source`. Bus bandwidths are what an all-reduce
# achieves on large messages, not the line rate, except where the source says it is the line rate.
LINKS: dict[str, Link] = {link.name: link for link in [
    Link("NVLink, 8×H100 node", 2.5e-6, 370e9,
         "line rate: NVIDIA's H100 Tensor Core GPU datasheet gives H100 SXM 900 GB/s of NVLink (both directions "
         "together: 450 GB/s each way) and 128 GB/s of PCIe Gen5 (H100 NVL: 600 GB/s NVLink); a datasheet gives "
         "no all-reduce figure. busbw 370 GB/s: what NCCL's ring achieves on NVLink4 (the 450 GB/s line rate "
         "less about 20% protocol overhead), NCCL maintainer in NVIDIA/nccl-tests#212. NVLink SHARP (NVLS), NCCL's "
         "default all-reduce there, reaches a busbw of about 480 GB/s on 8 GPUs for messages well above 256 MB "
         "(same thread; 476 GB/s measured in NVIDIA/nccl-tests#290). " + _NVLINK_ALPHA),
    Link("NVLink, 8×A100 node (fitted to a real log)", 2.5e-6, 207e9,
         "α 2.5 µs and busbw 207 GB/s: fit_link over the out-of-place rows (64 B to 8 GiB) of the all_reduce_perf "
         "run on 8 A100-SXM4-40GB in course_lib/nccl_logs.py (ONE_MACHINE, from oracle-japan/ocitutorials); its "
         "printed busbw peaks at 235 GB/s"),
    Link("PCIe 4.0 x16", 5e-6, 31.5e9,
         "31.5 GB/s is the LINE RATE of one direction, an upper bound no all-reduce reaches: 16 GT/s per lane × 16 "
         "lanes × 128/130 (encoding) / 8 bits (PCI Express Base Specification 4.0, PCI-SIG). α assumed 5 µs per "
         "message, an order of magnitude; not measured"),
    Link("400 Gb/s network (NDR InfiniBand)", 10e-6, 47e9,
         "busbw 47 GB/s: 46–48 GB/s per NDR 400 Gb/s NIC, NCCL maintainer in NVIDIA/nccl-tests#290; this is a "
         "ring whose slowest hop is one such NIC per machine (with k NICs per machine NCCL spreads its rings over "
         "them, up to k times as much). " + _NETWORK_ALPHA),
    Link("100 Gb/s network", 10e-6, 12.2e9,
         "busbw 12.2 GB/s: 'as good as you can get' for one 100 Gb/s card, NCCL maintainer in "
         "NVIDIA/nccl-tests#29 (the line rate is 12.5 GB/s); one such NIC per machine. " + _NETWORK_ALPHA),
]}


def _count(n, what: str = "n") -> int:
    """n as an int, by the course's rule for counts (course_lib.parallel.whole_number): an int (numpy's integers
    too) or an integral float such as 4096.0; a bool, a fraction, nan, inf or anything else is a ValueError."""
    if isinstance(n, numbers.Integral) and not isinstance(n, bool):
        return operator.index(n)
    if _real(n) and float(n).is_integer():
        return int(n)
    raise ValueError(f"{what} must be a whole number (an int, or an integral float such as 4096.0), not {n!r}")


def _ranks(n) -> int:
    n = _count(n, "the number of ranks n")
    if n < 1:
        raise ValueError(f"need 1 or more ranks, not {n}")
    return n


def all_reduce_time(nbytes: float, n: int, link: Link) -> float:
    """Seconds for a ring all-reduce of nbytes (one rank's tensor) over n ranks (notebook 05).

    t = 2(n−1)α + 2(n−1)/n · nbytes / busbw: lesson 04's α–β model with β = 1 / bus bandwidth. By nccl-tests'
    definition busbw = algbw · 2(n−1)/n = nbytes / t · 2(n−1)/n, so with α = 0 a link's measured busbw gives back
    exactly the time it was measured from. One rank: no message, no time.
    """
    n = _ranks(n)
    if not (_real(nbytes) and nbytes >= 0):
        raise ValueError(f"nbytes must be a finite number >= 0, not {nbytes!r}")
    if not isinstance(link, Link):
        raise ValueError(f"link must be a Link, not {type(link).__name__}")
    if n == 1:
        return 0.0
    return 2 * (n - 1) * link.alpha_s + 2 * (n - 1) / n * nbytes / link.bandwidth_Bps


def fit_link(sizes_bytes: Sequence[float], seconds: Sequence[float], world_size: int,
             name: str = "your machine", *, source: str | None = None) -> Link:
    """The Link whose ring all-reduce best matches a measured sweep: least squares on relative errors (notebook 05).

    Fits t ≈ a + b·S to (size, time) pairs, each row divided by its own t so that small sizes count as much as
    large ones (notebook 04 does the same), then reads α = a / (2(n−1)) and busbw = 2(n−1) / (n·b) off the line.
    Raises ValueError for bad inputs (fewer than two distinct sizes, lengths that differ, times <= 0, a world of one
    rank) and when the fitted α or bandwidth is not positive: the sweep is then too noisy or too narrow to read.
    """
    import numpy as np

    n = _count(world_size, "world_size")
    if n < 2:
        raise ValueError(f"a fit needs an all-reduce between 2 or more ranks, not world_size={n}")
    sizes, times = list(sizes_bytes), list(seconds)
    if len(sizes) != len(times):
        raise ValueError(f"{plural(len(sizes), 'size')} but {plural(len(times), 'time')}: one time per size")
    for s, t in zip(sizes, times):
        if not (_real(s) and s >= 0):
            raise ValueError(f"sizes must be finite numbers of bytes >= 0, not {s!r}")
        if not (_real(t) and t > 0):
            raise ValueError(f"times must be finite numbers of seconds > 0, not {t!r}")
    if len(set(sizes)) < 2:
        raise ValueError(f"a line needs 2 or more distinct sizes, got {plural(len(set(sizes)), 'size')}")
    s = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    scale = s.max()  # columns of similar magnitude keep the solve well conditioned
    design = np.stack([np.ones_like(s), s / scale], axis=1) / t[:, None]
    (a, b_scaled), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    b = b_scaled / scale
    if not (a > 0 and b > 0):
        raise ValueError(f"the fit is not physical: latency term {a:.3g} s and per-byte term {b:.3g} s/B must both be "
                         "> 0; the sweep is too noisy or too narrow: measure again, from small sizes to large ones")
    alpha = float(a) / (2 * (n - 1))
    bandwidth = 2 * (n - 1) / (n * float(b))
    if source is None:
        source = (f"fitted to your all-reduce sweep: {plural(len(sizes), 'size')}, {plural(n, 'rank')} "
                  "(least squares on relative errors)")
    return Link(name, alpha, bandwidth, source)


def parameter_bytes(model) -> list[int]:
    """Gradient bytes of each trainable parameter, in registration order, a tied weight once (notebook 05).

    The order DDP registers them in (model.parameters(), which skips a shared tensor's second name); frozen
    parameters (requires_grad=False) get no gradient and no place in a bucket. A gradient has its parameter's dtype.
    """
    return [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]


def _cap_bytes(mb, what: str) -> int:
    if not (_real(mb) and mb >= 0):
        raise ValueError(f"{what} must be a finite number of MiB >= 0, not {mb!r}")
    return int(mb * MIB)


def _bucket_members(grad_bytes_per_param: Sequence[int], bucket_cap_mb: float,
                    first_bucket_mb: float) -> list[list[int]]:
    """Indices (registration order) of the parameters in each bucket, buckets in the order DDP fills them.

    torch's own assignment (dist._compute_bucket_assignment_by_size, as DDP's reducer calls it when it rebuilds
    its buckets: parameters in reverse order, limits [first bucket, cap]), on stand-in gradients of the given
    sizes (expanded uint8 tensors: no memory). Exercise 05 writes this rule by hand; the model only uses it.
    """
    import torch
    import torch.distributed as dist

    sizes = [_count(b, "a parameter's gradient bytes") for b in grad_bytes_per_param]
    if any(b < 0 for b in sizes):
        raise ValueError(f"gradient bytes must be >= 0, got {min(sizes)}")
    limits = [_cap_bytes(first_bucket_mb, "first_bucket_mb"), _cap_bytes(bucket_cap_mb, "bucket_cap_mb")]
    if not sizes:
        return []
    grads = [torch.empty(1, dtype=torch.uint8).expand(b) if b else torch.empty(0, dtype=torch.uint8) for b in sizes]
    order = list(reversed(range(len(sizes))))  # gradients arrive in reverse registration order
    buckets, _ = dist._compute_bucket_assignment_by_size([grads[i] for i in order], limits, [False] * len(sizes),
                                                         order)
    return [list(bucket) for bucket in buckets]


def bucket_sizes(grad_bytes_per_param: Sequence[int], bucket_cap_mb: float = 25.0,
                 first_bucket_mb: float = 1.0) -> list[int]:
    """Bytes of each gradient bucket, in the order DDP fills and all-reduces them (notebook 05).

    DDP's rule (torch 2.14.1, torch/nn/parallel/distributed.py and the C++ Reducer, whose assignment is
    torch.distributed._compute_bucket_assignment_by_size): walk the parameters in the order their gradients are
    ready, approximated by reverse registration order; add each to the open bucket; close the bucket as soon as
    it holds at least the limit, so the parameter that crosses it is inside (a bucket can exceed its cap, and one
    parameter larger than the cap is a bucket of its own). The first bucket's limit is first_bucket_mb, every
    later one's bucket_cap_mb, in MiB. A cap of 0 gives one bucket per parameter.

    The buckets DDP uses after its first iteration. Four details of torch 2.14.1 this model leaves out:
    - the first iteration all-reduces everything as one bucket, then DDP rebuilds the buckets in the order the
      gradients really arrived (unless find_unused_parameters=True, which keeps its first assignment; with
      static_graph=True the rebuild waits one more iteration);
    - find_unused_parameters=True assigns at construction in REGISTRATION order, the small limit on the first
      bucket, and then reverses the list (_ddp_init_helper in torch/nn/parallel/distributed.py), so its small
      bucket holds the first layers and is all-reduced last: reversed(bucket_sizes(reversed(sizes))); so does
      the rebuild with the environment variable DDP_SET_LAST_BUCKET_CAP=1 (Reducer::rebuild_buckets, reducer.cpp);
    - the 1 MiB first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES) applies only when bucket_cap_mb is left at its
      default: DDP(..., bucket_cap_mb=25) makes the first bucket 25 MiB too, so model it with first_bucket_mb=25;
    - parameters of different dtypes or devices go to different buckets; here all are one dtype.
    """
    members = _bucket_members(grad_bytes_per_param, bucket_cap_mb, first_bucket_mb)
    sizes = list(grad_bytes_per_param)
    return [sum(sizes[i] for i in bucket) for bucket in members]


@dataclass(frozen=True)
class StepEstimate:
    """What the model predicts for one training step on each GPU, in seconds (notebook 05).

    compute_s: forward + backward, the same as on one GPU. comm_s: all the step's all-reduces, end to end.
    exposed_comm_s: the part of the step not hidden behind compute (step_s − compute_s). efficiency:
    compute_s / step_s, each GPU's throughput relative to one GPU alone (1.0: perfect scaling).
    """

    compute_s: float
    comm_s: float
    exposed_comm_s: float
    step_s: float
    efficiency: float


def _check_step_inputs(compute_s, backward_fraction, link):
    if not (_real(compute_s) and compute_s > 0):
        raise ValueError(f"compute_s must be a finite number of seconds > 0, not {compute_s!r}")
    if not (_real(backward_fraction) and 0 < backward_fraction <= 1):
        raise ValueError(f"backward_fraction must be in (0, 1], not {backward_fraction!r}")
    if not isinstance(link, Link):
        raise ValueError(f"link must be a Link, not {type(link).__name__}")


def _play_step(grad_bytes_per_param, compute_s, n, link, bucket_cap_mb, first_bucket_mb, overlap,
               backward_fraction):
    """(forward end, backward end, [(bytes, ready, start, end) per bucket]), in seconds from the step's start."""
    n = _ranks(n)
    _check_step_inputs(compute_s, backward_fraction, link)
    sizes = bucket_sizes(grad_bytes_per_param, bucket_cap_mb, first_bucket_mb)
    forward_end = (1 - backward_fraction) * compute_s
    backward_end = float(compute_s)
    total = sum(sizes)
    buckets, produced, stream_free = [], 0, 0.0
    for nbytes in sizes:
        produced += nbytes
        share = produced / total if total else 1.0
        ready = min(forward_end + share * (backward_end - forward_end), backward_end)  # uniformly, by bytes
        start = max(ready if overlap else backward_end, stream_free)  # one communication stream: one at a time
        end = start + (all_reduce_time(nbytes, n, link) if n > 1 else 0.0)
        buckets.append((nbytes, ready, start, end))
        stream_free = end
    return forward_end, backward_end, (buckets if n > 1 else [])


def ddp_step_time(grad_bytes_per_param: Sequence[int], compute_s: float, n: int, link: Link, *,
                  bucket_cap_mb: float = 25.0, overlap: bool = True, backward_fraction: float = BACKWARD_FRACTION,
                  first_bucket_mb: float = 1.0) -> StepEstimate:
    """Predict one DDP training step on n GPUs joined by `link` (notebook 05).

    The model, and every assumption in it:
    - Weak scaling: each GPU keeps its batch, so its forward + backward takes compute_s, as on one GPU; the
      optimizer step, data loading and the first iteration (one big bucket) are left out. Every rank is equally
      fast: no stragglers.
    - The step is forward ((1 − backward_fraction) · compute_s) then backward (backward_fraction · compute_s);
      by default BACKWARD_FRACTION, 2/3: backward ≈ 2× forward in FLOPs (Kaplan et al. 2020, arXiv:2001.08361
      §2.1, its 6N FLOPs per token), an estimate, not a measured time.
    - Gradients are bucketed by bucket_sizes (reverse registration order, first bucket first_bucket_mb, then
      bucket_cap_mb, in MiB), and they appear uniformly in backward's time by bytes: the bucket holding the
      first k bytes of gradient is ready after k / total of backward.
    - Each bucket is one ring all-reduce, all_reduce_time(bytes, n, link). They run one after another, in order, on
      one communication stream (a process group runs its collectives in order), and an all-reduce does not slow
      the compute it overlaps (in reality NCCL's kernels take some of the GPU's SMs and memory bandwidth).
    - overlap=True: bucket k starts when its gradients are ready and the previous all-reduce has ended.
      overlap=False: all of them start after backward, as in a hand-written all-reduce loop after backward().
    - The step ends when both backward and the last all-reduce have ended. One GPU: no communication at all.
    """
    _, backward_end, buckets = _play_step(grad_bytes_per_param, compute_s, n, link, bucket_cap_mb, first_bucket_mb,
                                          overlap, backward_fraction)
    comm = sum((end - start for _, _, start, end in buckets), 0.0)
    step = max([backward_end] + [end for *_, end in buckets])
    return StepEstimate(compute_s=float(compute_s), comm_s=comm, exposed_comm_s=step - compute_s, step_s=step,
                        efficiency=compute_s / step)


_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6}


def bucket_schedule(grad_bytes_per_param: Sequence[int], compute_s: float, n: int, link: Link, *,
                    bucket_cap_mb: float = 25.0, overlap: bool = True, backward_fraction: float = BACKWARD_FRACTION,
                    first_bucket_mb: float = 1.0, unit: str = "ms") -> list[Span]:
    """ddp_step_time's step as spans to draw with streams.draw_timeline, in ms by default (notebook 05).

    Lane "compute": the forward, then backward cut where each bucket's gradients are complete ("backward k").
    Lane "all-reduce": each bucket's all-reduce ("all-reduce k"), absent for one GPU.
    """
    if unit not in _UNITS:
        raise ValueError(f"unit must be one of {', '.join(_UNITS)}, not {unit!r}")
    scale = _UNITS[unit]
    forward_end, backward_end, buckets = _play_step(grad_bytes_per_param, compute_s, n, link, bucket_cap_mb,
                                                    first_bucket_mb, overlap, backward_fraction)
    spans = []
    if forward_end > 0:
        spans.append(Span("compute", "forward", 0.0, forward_end * scale, "compute"))
    if len(buckets) > 1:  # backward cut where each bucket's gradients are complete
        ends = [ready for _, ready, _, _ in buckets[:-1]] + [backward_end]
        labels = [f"backward {k}" for k in range(len(buckets))]
    else:
        ends, labels = [backward_end], ["backward"]
    previous = forward_end
    for end, label in zip(ends, labels):
        if end > previous:
            spans.append(Span("compute", label, previous * scale, end * scale, "compute"))
            previous = end
    for k, (_, _, start, end) in enumerate(buckets):
        spans.append(Span("all-reduce", f"all-reduce {k}", start * scale, end * scale, "communication"))
    return spans


def scaling_curve(grad_bytes_per_param: Sequence[int], compute_s: float, link: Link,
                  gpus: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256), **kw) -> list[tuple[int, StepEstimate]]:
    """(n, ddp_step_time(...)) for each GPU count, to plot efficiency against GPUs (notebook 05)."""
    return [(n, ddp_step_time(grad_bytes_per_param, compute_s, n, link, **kw)) for n in gpus]


# ---------------------------------------------------------------------------------------------------- models


def _resnet_parameter_counts(blocks: Sequence[int], bottleneck: bool, classes: int = 1000) -> list[int]:
    """Elements of each parameter of torchvision's ResNet, in registration order (weights=None, its defaults)."""
    counts = [64 * 3 * 7 * 7, 64, 64]  # conv1, bn1 weight and bias
    in_ch = 64
    for stage, depth in enumerate(blocks):
        width = 64 * 2**stage
        out_ch = width * 4 if bottleneck else width
        for block in range(depth):
            if bottleneck:  # conv1 1×1, bn1, conv2 3×3, bn2, conv3 1×1, bn3
                counts += [in_ch * width, width, width, width * width * 9, width, width, width * out_ch, out_ch,
                           out_ch]
            else:  # conv1 3×3, bn1, conv2 3×3, bn2
                counts += [in_ch * width * 9, width, width, width * width * 9, width, width]
            if block == 0 and (stage > 0 or in_ch != out_ch):  # downsample: conv 1×1 and its bn
                counts += [in_ch * out_ch, out_ch, out_ch]
            in_ch = out_ch
    return counts + [in_ch * classes, classes]  # fc


def _gpt_parameter_counts(layers: int, d_model: int, vocab: int, context: int) -> list[int]:
    """Elements of each parameter of a GPT-2-style decoder (nanoGPT's layout: biases, LayerNorms, tied embedding)."""
    d = d_model
    block = [d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * 4 * d, 4 * d, 4 * d * d, d]  # ln_1, attn, ln_2, mlp
    return [vocab * d, context * d] + block * layers + [d, d]  # wte (= lm_head), wpe, blocks, ln_f


# fp32 gradients: 4 bytes each. ResNets as torchvision builds them (11,689,512 and 25,557,032 parameters);
# GPT-3 XL's shape (Brown et al. 2020, Table 2.1: 24 layers, d_model 2048, context 2048) with GPT-2's 50,257 tokens.
MODELS: dict[str, list[int]] = {
    "ResNet-18 (11.7M)": [4 * c for c in _resnet_parameter_counts([2, 2, 2, 2], bottleneck=False)],
    "ResNet-50 (25.6M)": [4 * c for c in _resnet_parameter_counts([3, 4, 6, 3], bottleneck=True)],
    "GPT, 1.3B (GPT-3 XL shape)": [4 * c for c in _gpt_parameter_counts(24, 2048, 50257, 2048)],
}


def _as_gradient_bytes(name: str, model) -> list[int]:
    """A model given by its gradient bytes per parameter, or by a parameter count (fp32, in 64 equal tensors)."""
    if isinstance(model, numbers.Number) and not isinstance(model, bool):
        count = _count(model, f"{name}'s parameter count")
        if count < 1:
            raise ValueError(f"{name}: need 1 or more parameters, not {count}")
        pieces = min(64, count)
        return [4 * (count // pieces + (i < count % pieces)) for i in range(pieces)]
    sizes = [_count(b, f"{name}'s gradient bytes") for b in model]
    if not sizes or min(sizes) < 0:
        raise ValueError(f"{name}: need gradient bytes >= 0 for 1 or more parameters")
    return sizes


# ---------------------------------------------------------------------------------------------------- explorer

_GPU_CHOICES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
_BUCKET_CHOICES = [0, 1, 5, 10, 25, 50, 100, 250, 1000]  # MiB; 0: one bucket per parameter


def draw_ddp_step(grad_bytes_per_param: Sequence[int], compute_s: float, n: int, link: Link, *,
                  bucket_cap_mb: float = 25.0, overlap: bool = True, first_bucket_mb: float = 1.0,
                  measured: Mapping[int, float] | None = None, title: str = "") -> StepEstimate:
    """Draw the predicted efficiency against GPUs and the bucket timeline on n GPUs; print the step (notebook 05)."""
    import matplotlib.pyplot as plt

    kw = dict(bucket_cap_mb=bucket_cap_mb, first_bucket_mb=first_bucket_mb)
    gpus = sorted(set(_GPU_CHOICES) | set(measured or ()) | {n})
    fig, (curve, timeline) = plt.subplots(2, 1, figsize=(9, 6.2), height_ratios=[3, 2], layout="constrained")
    for setting in (overlap, not overlap):  # the chosen setting solid, the other dashed; each keeps its colour
        points = scaling_curve(grad_bytes_per_param, compute_s, link, gpus, overlap=setting, **kw)
        label = "MODEL, all-reduce overlapped with backward" if setting else "MODEL, all-reduce after backward"
        style = dict(marker="o", linewidth=2) if setting == overlap else dict(linestyle="--", linewidth=1, alpha=0.7)
        curve.plot([g for g, _ in points], [e.efficiency for _, e in points], label=label,
                   color="tab:blue" if setting else "tab:orange", **style)
    estimate = ddp_step_time(grad_bytes_per_param, compute_s, n, link, overlap=overlap, **kw)
    curve.plot([n], [estimate.efficiency], "o", markersize=11, markerfacecolor="none", color="black",
               label=f"{plural(n, 'GPU')}: {estimate.efficiency:.0%}")
    if measured:
        ranks = sorted(measured)
        curve.plot(ranks, [measured[r] for r in ranks], "s", color="tab:red", markersize=8,
                   label="measured on this machine (CPU, gloo)")
    curve.set_xscale("log", base=2)
    curve.set_xticks(gpus, [str(g) for g in gpus])
    curve.set_ylim(0, max([1.05] + [1.05 * e for e in (measured or {}).values()]))  # measured can beat 1
    curve.set(xlabel="GPUs (ranks)", ylabel="per-GPU efficiency (1 = perfect)",
              title=title or f"MODEL · scaling over {link.name}")
    curve.grid(alpha=0.3)
    curve.legend(loc="lower left", fontsize=8)
    spans = bucket_schedule(grad_bytes_per_param, compute_s, n, link, overlap=overlap, **kw)
    buckets = sum(1 for s in spans if s.lane == "all-reduce")
    how = "overlapped with backward" if overlap else "after backward"
    draw_timeline(spans, ax=timeline, lanes=["compute", "all-reduce"], unit="ms",
                  title=f"MODEL · one step on {plural(n, 'GPU')}: {plural(buckets, 'all-reduce')} {how}")
    plt.show()
    ms = 1e3
    print(f"MODEL, {plural(n, 'GPU')} over {link.name}: {plural(buckets, 'bucket')} "
          f"(first {first_bucket_mb:g} MiB, then {bucket_cap_mb:g} MiB)\n"
          f"step {estimate.step_s * ms:.3g} ms = compute {estimate.compute_s * ms:.3g} ms + exposed all-reduce "
          f"{estimate.exposed_comm_s * ms:.3g} ms (of {estimate.comm_s * ms:.3g} ms); "
          f"efficiency {estimate.efficiency:.1%}")
    return estimate


def ddp_explorer(measured: Mapping[int, float] | None = None,
                 model_params: Mapping[str, Sequence[int] | int] | None = None, *, fitted: Link | None = None,
                 model: str | None = None, gpus: int = 8, link: str | None = None, bucket_cap_mb: float = 25,
                 overlap: bool = True, compute_ms: float = DEFAULT_COMPUTE_MS):
    """Menus and sliders (model, GPUs, link, bucket size, overlap, compute time) that redraw the model (notebook 05).

    compute_ms defaults to DEFAULT_COMPUTE_MS, 34.5 ms: a ResNet-50 step (batch 128, bf16 autocast) measured on a lent
    H100 with torch 2.11 for this course (see the constant for its conditions and the H200 record beside it).

    measured: {ranks: efficiency measured here}, drawn beside the prediction as "measured on this machine (CPU,
    gloo)". model_params: {name: gradient bytes per parameter (parameter_bytes(model)), or a parameter count,
    taken as fp32 in 64 equal tensors}; MODELS by default. fitted: a Link from fit_link, offered first in the menu
    of links. Returns the widget; its .result is the last StepEstimate drawn.
    """
    import ipywidgets as widgets

    given = MODELS if model_params is None else model_params
    models = {name: _as_gradient_bytes(name, m) for name, m in given.items()}
    if not models:
        raise ValueError("model_params is empty: give at least one model")
    for ranks, efficiency in (measured or {}).items():
        if _count(ranks, "a measured rank count") < 1 or not (_real(efficiency) and efficiency >= 0):
            raise ValueError(f"measured maps rank counts >= 1 to efficiencies >= 0, not {ranks!r}: {efficiency!r}")
    if fitted is not None and not isinstance(fitted, Link):
        raise ValueError(f"fitted must be a Link (from fit_link), not {type(fitted).__name__}")
    links = ({fitted.name: fitted} if fitted is not None else {}) | {k: v for k, v in LINKS.items()
                                                                      if fitted is None or k != fitted.name}
    model = model if model is not None else (next(iter(models)) if model_params else "ResNet-50 (25.6M)")
    link = link if link is not None else "NVLink, 8×H100 node"
    if model not in models or link not in links:
        raise ValueError(f"unknown model {model!r} or link {link!r}")
    gpu_choices = sorted(set(_GPU_CHOICES) | set(measured or ()) | {gpus})
    bucket_choices = sorted(set(_BUCKET_CHOICES) | {bucket_cap_mb})
    wide = {"description_width": "initial"}

    def show(model, gpus, link, bucket_cap_mb, overlap, compute_ms):
        # DDP's default (bucket_cap_mb left out: 25 MiB) has a 1 MiB first bucket; any cap passed explicitly, none
        first = 1.0 if bucket_cap_mb == 25 else bucket_cap_mb
        return draw_ddp_step(models[model], compute_ms / 1e3, gpus, links[link], bucket_cap_mb=bucket_cap_mb,
                             first_bucket_mb=first, overlap=overlap, measured=measured,
                             title=f"MODEL · {model} over {link}")

    return widgets.interactive(
        show,
        model=widgets.Dropdown(options=list(models), value=model, description="model", style=wide),
        gpus=widgets.SelectionSlider(options=gpu_choices, value=gpus, description="GPUs", style=wide),
        link=widgets.Dropdown(options=list(links), value=link, description="link", style=wide,
                              layout=widgets.Layout(width="420px")),
        bucket_cap_mb=widgets.SelectionSlider(options=bucket_choices, value=bucket_cap_mb,
                                              description="bucket_cap_mb (0: per parameter)", style=wide),
        overlap=widgets.Checkbox(value=overlap, description="overlap all-reduce with backward", style=wide),
        # from 0.1 to 10^4 ms, starting at compute_ms (a plain FloatLogSlider would show 34.5 as 35.5 in the browser)
        compute_ms=log_slider(compute_ms, min(0.1, compute_ms), max(1e4, compute_ms),
                              description="compute per step (ms)", style=wide),
    )
