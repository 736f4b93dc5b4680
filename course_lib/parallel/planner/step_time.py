"""Time of one training step for a layout: compute at a stated MFU, communication by the α–β model, the bubble
(lesson 09).

    flops_per_token(shape, seq_len)        torchtitan's count: 6·N + 12·l·h·q·t (embedding excluded by default)
    mfu(tokens_per_s_per_gpu, shape, seq_len, peak_flops)   torchtitan's MFU of a measured throughput
    recompute_factor(shape, seq_len, checkpointing)         how much compute activation checkpointing adds
    group_link(cluster, stride, size)      the link a group of GPUs talks over (NVLink, or the nodes' NICs)
    comm_times(shape, layout, cluster, seq_len)             seconds per step of each parallelism's collectives
    step_time(shape, layout, cluster, seq_len, mfu=ASSUMED_MFU)   a StepTime: compute, exposed comm, bubble, tokens/s

Communication is priced with `course_lib.parallel.links.all_reduce_time` (lesson 04's ring, 2(n−1)α +
2(n−1)/n·S/busbw; an all-gather or reduce-scatter is half of it, an all-to-all too: each rank sends (n−1)/n of its
buffer) and with the byte counts of `sharding.comm_volume` (FSDP/ZeRO) and `tensor_parallel.tp_comm_volume` (TP).
The bubble is `pipeline.gpipe_bubble` (GPipe, 1F1B) or `pipeline.interleaved_bubble`. Not modelled: the optimizer
step, data loading, kernel launch gaps, Float8, torch.compile, async TP.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.parallel import whole_number
from course_lib.parallel.links import Link, all_reduce_time
from course_lib.parallel.pipeline.schedules import as_fraction_of_total, gpipe_bubble, interleaved_bubble
from course_lib.parallel.planner.inputs import Cluster, Layout, ModelShape
from course_lib.parallel.planner.memory import model_parallel_params
from course_lib.parallel.sharding import comm_volume
from course_lib.parallel.tensor_parallel import tp_comm_volume

__all__ = ["ASSUMED_MFU", "OVERLAPPED", "flops_per_token", "mfu", "recompute_factor", "group_link", "comm_times",
           "StepTime", "step_time"]

# An assumption, not a measurement: between torchtitan's "33% to 39% MFU" for Llama 3.1 8B in bf16 on H100
# (benchmarks/llama3_h100_202412_torchtitan.md) and Megatron-LM's "up to 47%" on H100 (its README, 2026).
ASSUMED_MFU = 0.40

# The overlap assumption: these collectives run on their own stream behind compute (FSDP2 prefetches the next
# block's all-gather and reduce-scatters behind the backward; HSDP's all-reduce likewise; ring attention passes the
# next KV block while it attends to this one), so only what exceeds the compute shows. TP's and EP's collectives and
# PP's sends are on the critical path (the next op needs their result) and always show.
OVERLAPPED = ("fsdp", "hsdp", "cp")


def flops_per_token(shape: ModelShape, seq_len: int, *, exclude_embedding: bool = True) -> float:
    """Training FLOPs per token, torchtitan's `get_num_flop_per_token`: 6·N + 12·l·h·q·t (`torchtitan/utils.py`
    @0011fb90: "each self-attention has 2 matmul in the forward and 4 in the backward", flash's recompute not
    counted, causal sparsity ignored), l layers, h heads, q = dim/heads, t = seq_len. N: every parameter (the April
    2024 A100 table) or, with exclude_embedding (torchtitan since 2024-05-01, `4d8c24520`), all but tok_embeddings;
    the output layer stays. MoE counts the parameters a token uses (top_k experts), as torchtitan's HEAD does."""
    t = whole_number(seq_len, "seq_len")
    n = shape.params()["active"] - (shape.params()["embedding"] if exclude_embedding else 0)
    return 6 * n + 12 * shape.n_layers * shape.n_heads * shape.head_dim * t


def mfu(tokens_per_s_per_gpu: float, shape: ModelShape, seq_len: int, peak_flops: float, *,
        exclude_embedding: bool = True) -> float:
    """Model FLOPs utilisation (a fraction) of a measured throughput, as torchtitan logs it (`train.py` @9dec370:
    100 · num_flop_per_token · tps / gpu_peak_flops)."""
    if not tokens_per_s_per_gpu >= 0 or not peak_flops > 0:
        raise ValueError(f"tokens_per_s_per_gpu must be >= 0 and peak_flops > 0, not {tokens_per_s_per_gpu!r}, "
                         f"{peak_flops!r}")
    return flops_per_token(shape, seq_len, exclude_embedding=exclude_embedding) * tokens_per_s_per_gpu / peak_flops


def recompute_factor(shape: ModelShape, seq_len: int, checkpointing: str) -> float:
    """Compute run ÷ model FLOPs. "full" runs each layer's forward twice: + one third (the forward is 2N + 4lhqt of
    6N + 12lhqt). "selective" (torchtitan's per-op SAC) re-runs wk, wo and w3 (every second mm; MoE: the experts):
    + 2·l·(h·kv + h² + h·f)/flops_per_token; its elementwise recompute is left out (few FLOPs). "none": 1."""
    if checkpointing == "none":
        return 1.0
    per_token = flops_per_token(shape, seq_len)
    if checkpointing == "full":
        forward = (per_token - 6 * shape.params()["output"]) / 3  # every layer's forward; the output layer is not
        return 1 + forward / per_token
    if checkpointing == "selective":
        h = shape.dim
        mlp = shape.top_k * 3 * h * shape.expert_ffn_hidden if shape.n_experts else h * shape.ffn_hidden
        return 1 + 2 * shape.n_layers * (h * shape.kv_dim + h * h + mlp) / per_token
    raise ValueError(f"checkpointing must be 'none', 'selective' or 'full', not {checkpointing!r}")


def group_link(cluster: Cluster, stride: int, size: int) -> Link:
    """The link a group of `size` GPUs, `stride` apart in the rank order, talks over. Inside a node: the node's
    link. Across nodes: the network, each member GPU using its own NIC, so a group with g members per node gets g
    NICs' bandwidth (links.py's 400 Gb/s entry: "with k NICs per machine NCCL spreads its rings over them, up to k
    times as much"), at most the node's own link; an assumption for NICs one per GPU, as on torchtitan's machine."""
    if stride * size <= cluster.gpus_per_node:
        return cluster.intra_node
    per_node = max(1, min(size, cluster.gpus_per_node // stride))
    net = cluster.inter_node
    return Link(f"{net.name} ×{per_node}", net.alpha_s, min(per_node * net.bandwidth_Bps,
                                                             cluster.intra_node.bandwidth_Bps),
                f"{per_node} GPU(s) per node, each its own NIC: {net.source}")


def _ring(sent_bytes: float, n: int, link: Link, kind: str, messages: float) -> float:
    """Seconds for ring collectives sending sent_bytes per rank in `messages` calls: α per ring step, β per byte."""
    steps = 2 * (n - 1) if kind == "all-reduce" else n - 1
    return messages * steps * link.alpha_s + sent_bytes / link.bandwidth_Bps


def comm_times(shape: ModelShape, layout: Layout, cluster: Cluster, seq_len: int) -> dict[str, float]:
    """Seconds of each parallelism's communication per step on one GPU (torchtitan's mesh: tp innermost, then cp,
    dp_shard, dp_replicate, pp; EP's ranks taken contiguous, an assumption), before any overlap.

    fsdp: comm_volume's collectives of the GPU's parameters (bf16 all-gathers, fp32 reduce-scatter: torchtitan's
    reduce_dtype) at the ZeRO stage, one per block; per micro-batch without PP, once per step with PP (torchtitan
    keeps the stage gathered: one all-gather, comm_volume's stage-2 volume). hsdp: an fp32 all-reduce of the shard
    over dp_replicate. tp: tp_comm_volume's two all-reduces per block forward and two backward, of b·s·h bf16
    (with SP an all-gather and a reduce-scatter each, the same bytes), plus the forward's again when recomputed.
    Selective checkpointing re-runs the all-gathers before the recomputed mms: one more all-reduce's worth per
    block (an assumption from torchtitan's SAC list, which saves reduce_scatter's outputs but not all_gather's).
    cp: the ring passes K and V (n_kv_heads, bf16: an assumption, torchtitan's Llama repeated KV heads before SDPA
    then) cp−1 times forward, and K, V and their gradients backward (Liu et al. 2023, ring attention).
    ep: four all-to-alls per MoE layer (dispatch and combine, forward and backward) of top_k·tokens·h bf16
    (research/lesson-09.md §3, derived there, not sourced); two more when full checkpointing recomputes them.
    pp: each micro-batch's activation (b·s·h bf16, ÷tp with SP) sent forward and its gradient back, per stage.
    """
    b, s, h, t = layout.micro_batch, seq_len / layout.cp, shape.dim, layout.tp
    m, n_layers = layout.n_microbatches, layout.layers_per_gpu(shape)
    ckpt = layout.activation_checkpointing
    sp = t if layout.sequence_parallel and t > 1 else 1
    out = {"fsdp": 0.0, "hsdp": 0.0, "tp": 0.0, "cp": 0.0, "ep": 0.0, "pp": 0.0}
    part = model_parallel_params(shape, layout, "only" if layout.pp == 1 else "first")
    psi = part["dense"] + part["expert"]  # this GPU's parameters before ZeRO/FSDP (experts priced on FSDP's link)
    syncs = m if layout.pp == 1 else 1
    if layout.fsdp > 1:
        stage = 2 if layout.zero_stage == 3 and layout.pp > 1 else layout.zero_stage
        volume = comm_volume(round(psi), layout.fsdp, stage, 2, reduce_bytes_per_param=4)
        link = group_link(cluster, t, layout.fsdp)
        calls = n_layers + 1 if layout.zero_stage == 3 else 1  # one collective per fully_shard unit, or bucketed
        out["fsdp"] = syncs * sum(_ring(sent, layout.fsdp, link, "all-reduce" if "all-reduce" in name else "ring",
                                        calls) for name, sent in volume["collectives"])
    if layout.dp_replicate > 1:
        shard = 4 * psi / (layout.fsdp if layout.zero_stage >= 2 else 1)
        n = layout.dp_replicate
        out["hsdp"] = syncs * all_reduce_time(shard, n, group_link(cluster, t * layout.fsdp, n))
    if t > 1:
        per_layer = tp_comm_volume(b, round(s), h, t)
        calls = {"none": 4, "selective": 5, "full": 6}[ckpt]  # selective re-gathers the recomputed mms' inputs
        one = all_reduce_time(per_layer["activation_bytes"], t, group_link(cluster, 1, t))
        out["tp"] = n_layers * m * calls * one
    if layout.cp > 1:
        block = 2 * b * s * shape.kv_dim * 2 / t
        passes = (layout.cp - 1) * (4 if ckpt == "full" else 3)
        link = group_link(cluster, t, layout.cp)
        out["cp"] = n_layers * m * passes * (link.alpha_s + block / link.bandwidth_Bps)
    if layout.ep > 1 and shape.n_experts:
        buffer = b * s * shape.top_k * h * 2 / sp
        calls = 6 if ckpt == "full" else 4
        out["ep"] = n_layers * m * calls * all_reduce_time(buffer, layout.ep, group_link(cluster, 1, layout.ep)) / 2
    if layout.pp > 1:
        link = group_link(cluster, t * layout.fsdp * layout.dp_replicate, layout.pp)
        sends = 2 * m * layout.virtual_stages
        out["pp"] = sends * (link.alpha_s + b * s * h * 2 / sp / link.bandwidth_Bps)
    return out


@dataclass(frozen=True)
class StepTime:
    """One step on one GPU: compute_s (at the stated MFU, recompute included), comm_s per parallelism before
    overlap, exposed_comm_s (what overlap does not hide), bubble (fraction of the step), step_s, tokens/s per GPU,
    and mfu_predicted: the MFU torchtitan would log for this step."""

    compute_s: float
    recompute_factor: float
    comm_s: dict
    exposed_comm_s: float
    bubble: float
    step_s: float
    tokens_per_s_per_gpu: float
    mfu_predicted: float


def step_time(shape: ModelShape, layout: Layout, cluster: Cluster, seq_len: int, *,
              mfu: float = ASSUMED_MFU) -> StepTime:
    """One training step of `layout` on `cluster`: (compute + exposed communication) / (1 − bubble).

    compute: flops_per_token × this GPU's tokens (global batch × seq_len / GPUs) × recompute_factor / (peak × mfu),
    mfu the fraction of peak the model's FLOPs get (a stated parameter, ASSUMED_MFU by default). Communication:
    comm_times, of which the OVERLAPPED kinds show only beyond the compute, but at least one FSDP unit's share (the
    first all-gather and the last reduce-scatter of a step have nothing to hide behind). Bubble: the schedule's
    idle share, (p−1)/(m+p−1) for GPipe and 1F1B, (p−1)/(v·m) of the ideal time for interleaved 1F1B
    (Narayanan et al. 2021, arXiv:2104.04473 §2.2).
    """
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be a fraction of the peak in (0, 1], not {mfu!r}")
    layout.check_against(shape, seq_len, cluster.n_gpus)
    tokens = layout.global_batch() * seq_len / layout.n_gpus
    factor = recompute_factor(shape, seq_len, layout.activation_checkpointing)
    compute = flops_per_token(shape, seq_len) * tokens * factor / (cluster.peak_flops * mfu)
    comm = comm_times(shape, layout, cluster, seq_len)
    hidden = sum(comm[k] for k in OVERLAPPED)
    # the step's first all-gather and last reduce-scatter have no compute beside them: one FSDP unit's share shows
    edges = comm["fsdp"] / (layout.layers_per_gpu(shape) + 1)
    exposed = sum(v for k, v in comm.items() if k not in OVERLAPPED) + max(edges, hidden - compute)
    if layout.pp == 1:
        bubble = 0.0
    elif layout.pp_schedule == "interleaved":
        bubble = as_fraction_of_total(interleaved_bubble(layout.pp, layout.n_microbatches, layout.virtual_stages))
    else:
        bubble = gpipe_bubble(layout.pp, layout.n_microbatches)
    step = (compute + exposed) / (1 - bubble)
    rate = tokens / step
    predicted = flops_per_token(shape, seq_len) * rate / cluster.peak_flops
    return StepTime(compute, factor, comm, exposed, bubble, step, rate, predicted)
