"""DistributedDataParallel's step as a model: links, the ring all-reduce, buckets, overlap, scaling (notebook 05).

    Link, LINKS, all_reduce_time, fit_link   links and the ring all-reduce: in links.py, imported from here
    parameter_bytes(model)            gradient bytes per trainable parameter, in registration order
    bucket_sizes(grad_bytes)          the bytes of each of DDP's buckets, in the order DDP fills them
    ddp_step_time(...)                one DDP step, its all-reduces overlapped with backward or after it
    bucket_schedule(...)              the same step as spans, to draw with streams.draw_timeline
    scaling_curve(...)                the step on 1, 2, 4, ... GPUs: per-GPU efficiency against GPU count
    MODELS                            gradient bytes per parameter of ResNet-18, ResNet-50 and a 1.3B GPT
    draw_ddp_step(...), ddp_explorer(...)   the step drawn, and the explorer: in ddp_pictures.py, imported from here
    BACKWARD_FRACTION, DEFAULT_COMPUTE_MS   the model's two default figures, each with its source

Everything here is a model: it predicts and measures nothing (fit_link reads a sweep you measured). Exercise 05
builds DDP's buckets and hooks in real ranks (its own bucket assignment, which is not this module's bucket_sizes);
this module says how long such a step would take on links a laptop does not have, and why overlap and bucket
size matter there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from course_lib.parallel.links import LINKS, Link, _count, _ranks, _real, all_reduce_time, fit_link
from course_lib.parallel.streams import Span

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


def __getattr__(name: str):
    """draw_ddp_step and ddp_explorer, from ddp_pictures.py: imported on first use, as matplotlib and ipywidgets are."""
    if name in ("draw_ddp_step", "ddp_explorer"):
        from course_lib.parallel import ddp_pictures

        return getattr(ddp_pictures, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
