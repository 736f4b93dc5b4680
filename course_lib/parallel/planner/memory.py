"""Memory per GPU of one training layout, term by term: model state, activations, FSDP's buffers, the loss (lesson 09).

    layer_activations(shape, seq_len, micro_batch, ...)   bytes one layer keeps for its backward, and its working set
    model_parallel_params(shape, layout, stage)           parameters on one GPU after TP, PP and EP, before ZeRO
    memory_per_gpu(shape, layout, seq_len)                 a MemoryBreakdown of the most loaded GPU
    MemoryBreakdown                                        params, grads, optimizer, activations, fsdp_buffers, loss

Mixed precision as torchtitan trains (FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), AdamW):
the model state is ZeRO's 2Ψ + 2Ψ + 12Ψ bytes (Rajbhandari et al. 2020, Figure 1; the Ultra-Scale Playbook §1.5:
"m_params = 2N, m_grad = 2N, m_params_fp32 = 4N, m_opt = (4+4)N"), sharded at the layout's ZeRO stage over
dp_shard × cp ranks by `course_lib.parallel.sharding.zero_memory`. FSDP2 keeps the same 16 bytes per parameter
as 4 (fp32 sharded parameter) + 4 (fp32 gradient) + 8 (Adam); the breakdown printed is ZeRO's, the total the same.
Before that sharding, TP divides every matrix of a block, the embedding and the output layer by tp but not the
RMSNorm weights (torchtitan's plan: SequenceParallel norms are replicated); PP gives each GPU ceil(L/(pp·v))·v
layers, the first stage also the embedding, the last the final norm and output layer (Megatron-LM's
`theoretical_memory_usage.py` @00caa53a counts the same "most loaded model shard"); EP splits the experts.

Activations: Korthikanti et al. 2022 (arXiv:2205.05198) §4, Table 2's accounting (bytes stored per tensor a layer's
backward needs), applied to the Llama block (no dropout, RMSNorm, grouped-query attention, SwiGLU): see
layer_activations. Everything here is the peak of *allocated* bytes; torchtitan's tables give the caching
allocator's peak *reserved* bytes, which add its cache and fragmentation (not modelled).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from course_lib.parallel import whole_number
from course_lib.parallel.pipeline.schedules import peak_in_flight, simulate
from course_lib.parallel.planner.inputs import Layout, ModelShape
from course_lib.parallel.sharding import zero_memory

__all__ = ["MemoryBreakdown", "layer_activations", "memory_per_gpu", "model_parallel_params",
           "LOSS_PEAK_BYTES_PER_LOGIT", "GiB"]

GiB = 2**30

# Measured for this course (torch 2.14.1, CPU, torch.distributed._tools.mem_tracker.MemTracker): F.linear in bf16,
# .float(), F.cross_entropy, backward peaked at 11.7 bytes per logit above its inputs: the bf16 logits, their fp32
# copy, log-softmax's fp32 output (saved) and, in the backward, two fp32 gradients of that size. torchtitan's Llama
# returned `self.output(h).float()` and took cross_entropy of it. A CPU measurement, not a GPU one.
LOSS_PEAK_BYTES_PER_LOGIT = 12


def layer_activations(shape: ModelShape, seq_len: int, micro_batch: int, *, tp: int = 1, cp: int = 1,
                      sequence_parallel: bool = True, checkpointing: str = "none", flash: bool = True) -> dict:
    """Bytes one transformer layer keeps from its forward for its backward, per micro-batch, on one GPU.

    Korthikanti et al. 2022, §4.1 and Table 2: sbh(34 + 5as/h) with 16-bit activations (s sequence, b micro-batch,
    h hidden, a heads) for a GPT layer: 11sbh + 5as²b attention, 19sbh MLP, 4sbh layer norms, dropout masks
    included. The same count for a Llama block (no dropout, SwiGLU with hidden f, K and V of width kv):
    2·2sbh norm inputs, 2sbh attention input, 2sb(h + 2kv) Q/K/V after RoPE, 2sbh attention output, 2sbh MLP
    input, 4·2sbf for w1's and w3's outputs, silu's output and the product (w2's input); 12 + 4kv/h + 8f/h in all.
    GPT's layer (kv = h; a GeLU MLP keeping two 4h-wide tensors, as SwiGLU with f = 2h keeps four) gives 32: the
    paper's 34 less its two 1-byte dropout masks (attention 10, MLP 18, norms 4). With flash attention (torch's
    SDPA on a GPU) the 5as²b of scores is never stored: the kernel recomputes it, which is exactly the paper's
    "selective recomputation"; flash=False adds it back.
    TP (t): Korthikanti's Table 2 TP row keeps the norms' and the blocks' inputs whole and divides the rest by t;
    with sequence parallelism the norm inputs are divided too. The blocks' inputs stay whole here even with SP:
    torch's ColwiseParallel saves the all-gathered input for its matmul's backward (the paper re-gathers it, §4.2.2,
    which torch does not). CP divides the sequence: s = seq_len / cp. MoE: top_k experts' SwiGLU per token.

    checkpointing: "none" keeps all of it. "selective" is torchtitan's per-op SAC (`torchtitan/parallelisms/
    parallelize_llama.py` @004b3148, `_apply_ac_to_transformer_block`, op mode) saves the outputs of mm, SDPA and
    reduce_scatter, except every second mm, and recomputes the rest, so a layer keeps its input, SDPA's output (and
    its fp32 logsumexp) and the outputs of wq, wv, w1 and w2 of its seven mms (wk, wo, w3 recomputed); w2's output
    is the whole partial sum before TP's reduce-scatter, whose output (like wo's) is kept too. MoE layers: the
    attention's part and the MLP input (experts recomputed, an assumption). "full" keeps the layer input only
    (torch.utils.checkpoint saves a block's inputs).
    Returns {"stored": bytes kept per layer, "working": bytes recomputed during one layer's backward (0 for none),
    "terms": {tensor: bytes} of the unchecked layer}.
    """
    s = whole_number(seq_len, "seq_len") / whole_number(cp, "cp")
    b, t = whole_number(micro_batch, "micro_batch"), whole_number(tp, "tp")
    h, kv, a = shape.dim, shape.kv_dim, shape.n_heads
    sp = sequence_parallel and t > 1
    sbh = s * b * h
    terms = {"norm inputs": 4 * sbh / (t if sp else 1), "attention input": 2 * sbh,
             "Q, K, V": 2 * s * b * (h + 2 * kv) / t, "attention output": 2 * sbh / t, "MLP input": 2 * sbh}
    if not flash:
        terms["attention scores"] = 5 * a * s * s * b / t
    if shape.n_experts:
        f_tokens = shape.top_k * shape.expert_ffn_hidden
        terms["dispatched tokens"] = 2 * shape.top_k * sbh / t
        terms["router"] = 4 * s * b * shape.n_experts / t
    else:
        f_tokens = shape.ffn_hidden
    terms["SwiGLU hidden"] = 8 * s * b * f_tokens / t
    unchecked = sum(terms.values())
    layer_input = 2 * sbh / (t if sp else 1)
    if checkpointing == "none":
        stored = unchecked
    elif checkpointing == "full":
        stored = layer_input
    elif checkpointing == "selective":
        stored = layer_input + (2 * sbh + 2 * s * b * kv + 2 * sbh) / t + 4 * s * b * a / t  # wq, wv, SDPA, lse
        if not shape.n_experts:
            stored += 2 * s * b * shape.ffn_hidden / t + 2 * sbh  # w1's output; w2's (partial sum when t > 1)
            stored += 2 * 2 * sbh / t if t > 1 else 0  # the two reduce-scatter outputs (wo's and w2's)
        else:
            stored += terms["MLP input"]
    else:
        raise ValueError(f"checkpointing must be 'none', 'selective' or 'full', not {checkpointing!r}")
    return {"stored": stored, "working": max(0.0, unchecked - stored) if checkpointing != "none" else 0.0,
            "terms": terms}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the most loaded GPU (`stage`: "only", "first" or "last" pipeline stage) at its peak.

    params, grads, optimizer: the model state after TP/PP/EP and the ZeRO stage. activations: what the layers keep
    for the backward times the micro-batches in flight, plus one layer's recomputed working set. fsdp_buffers: what
    FSDP2 holds unsharded meanwhile. loss: the output layer's input and the logits' peak in the loss (last stage).
    """

    params: float
    grads: float
    optimizer: float
    activations: float
    fsdp_buffers: float
    loss: float
    stage: str
    in_flight: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.fsdp_buffers + self.loss

    def gib(self) -> dict[str, float]:
        """Each term and the total in GiB (2³⁰ bytes), rounded to 0.1."""
        row = {k: round(v / GiB, 1) for k, v in asdict(self).items() if k not in ("stage", "in_flight")}
        return {**row, "total": round(self.total / GiB, 1)}


@functools.lru_cache(maxsize=512)
def _in_flight(schedule: str, pp: int, m: int, v: int) -> tuple[float, float]:
    """Micro-batches' worth of activations held at the peak by the first and the last GPU of the pipeline (notebook
    07's peak_in_flight): GPipe holds all m, 1F1B min(p, m) on the first GPU and 1 on the last. Interleaved 1F1B is
    played by course_lib.parallel.pipeline's simulator (its (micro-batch, chunk) pairs each hold 1/v of the GPU's
    layers): for large m it gives Megatron-LM's p·(1 + (p−1)/(p·v)) on the first GPU; the peak is reached within
    the warm-up, so m is capped at p·(v + 2) for the simulation, which gives the same peak (checked in the tests)."""
    if pp == 1:
        return 1.0, 1.0
    if schedule == "gpipe":
        return float(m), float(m)
    if schedule == "1f1b":
        return float(min(pp, m)), 1.0
    peak = peak_in_flight(simulate("interleaved-1f1b", pp, min(m, pp * (v + 2)), chunks=v))
    return peak[0] / v, peak[pp - 1] / v


def model_parallel_params(shape: ModelShape, layout: Layout, stage: str = "first") -> dict[str, float]:
    """Parameters on one GPU after TP, PP and EP, before ZeRO/FSDP: "dense" (sharded over dp_shard × cp), "expert"
    (over torchtitan's expert FSDP mesh), "root" (the embedding, final norm and output layer this stage holds)
    and "layer" (one layer's share). stage: "only" (no PP), "first" or "last" (PP's stages differ by the root)."""
    p, t, n = shape.params(), layout.tp, layout.layers_per_gpu(shape)
    if shape.n_experts:
        router = shape.dim * shape.n_experts  # replicated, as torchtitan's NoParallel router
        expert_layer = (p["mlp"] - router) / (layout.ep if layout.ep > 1 else t)
        dense_layer = p["attention"] / t + router + p["norms"]
    else:
        expert_layer, dense_layer = 0.0, (p["attention"] + p["mlp"]) / t + p["norms"]
    root = p["embedding"] / t if stage in ("only", "first") else 0.0
    root += p["output"] / t + p["final_norm"] if stage in ("only", "last") else 0.0
    return {"dense": n * dense_layer + root, "expert": n * expert_layer, "root": root,
            "layer": dense_layer + expert_layer}


def _state(shape: ModelShape, layout: Layout, stage: str) -> tuple[float, float, float, float]:
    """params, grads, optimizer (bytes, ZeRO's split) and fsdp_buffers of one GPU at `stage`."""
    part = model_parallel_params(shape, layout, stage)
    # experts are sharded over dp_shard·cp·tp/ep ranks when ep > 1 (torchtitan's `efsdp`), like the rest otherwise
    expert_ranks = layout.fsdp * layout.tp // layout.ep if layout.ep > 1 else layout.fsdp
    z = layout.zero_stage
    rows = [zero_memory(round(part["dense"]), layout.fsdp, stages=[z])[z],
            zero_memory(round(part["expert"]), expert_ranks, stages=[z])[z]]
    params, grads, optimizer = (sum(r[k] for r in rows) for k in ("params", "grads", "optimizer"))
    buffers = 0.0
    if z == 3 and layout.fsdp > 1:
        if layout.pp > 1:
            # torchtitan: reshard_after_forward=False under PP; torch's PipelineStage turns gradient sync off until
            # the last micro-batch (torch 2.14.1 `distributed/pipelining/stage.py`), so the stage's bf16 params stay
            # gathered and its gradients accumulate unsharded in fp32 (FSDPParam.to_accumulated_grad_if_needed)
            buffers = (2 + 4) * (part["dense"] + part["expert"])
        else:
            # torchtitan's apply_fsdp (`parallelize_llama.py` @004b3148): each block, then the model, fully_shard'ed;
            # the root unit (embedding, norm, output: torchtitan's fully_shard(model)) gathered in bf16 with its
            # bf16 gradients until the end of backward; two blocks gathered (one prefetched), one block's bf16
            # gradients and their fp32 copy for the reduce-scatter (reduce_dtype=float32)
            buffers = (2 + 2) * part["root"] + 2 * 2 * part["layer"] + (2 + 4) * part["layer"]
    return params, grads, optimizer, buffers


def memory_per_gpu(shape: ModelShape, layout: Layout, seq_len: int, *, flash: bool = True) -> MemoryBreakdown:
    """Peak bytes on the most loaded GPU for `shape` trained with `layout` on sequences of seq_len tokens.

    Each pipeline stage that differs (the first holds the embedding and the most micro-batches in flight, the last
    the output layer and the loss) is priced and the larger returned: torchtitan's tables "take the maximum
    across all GPUs". Activations: layer_activations' stored bytes × the GPU's layers × micro-batches in flight (1
    without PP: accumulated micro-batches run one after another; with PP the schedule's peak, _in_flight), plus one
    layer's working set while it is recomputed, plus the token ids (8 bytes each, Megatron-LM's "input to
    embedding"). loss (last stage): the output layer's input (2sbh, all-gathered under TP) and
    LOSS_PEAK_BYTES_PER_LOGIT per logit (s·b·V/tp: torchtitan's loss_parallel keeps the vocabulary sharded).
    """
    layout.check_against(shape, seq_len)
    b, s = layout.micro_batch, seq_len / layout.cp
    acts = layer_activations(shape, seq_len, b, tp=layout.tp, cp=layout.cp,
                             sequence_parallel=layout.sequence_parallel,
                             checkpointing=layout.activation_checkpointing, flash=flash)
    first, last = _in_flight(layout.pp_schedule, layout.pp, layout.n_microbatches, layout.virtual_stages)
    n = layout.layers_per_gpu(shape)
    best = None
    for stage, in_flight in ([("only", 1.0)] if layout.pp == 1 else [("first", first), ("last", last)]):
        params, grads, optimizer, buffers = _state(shape, layout, stage)
        activations = acts["stored"] * n * in_flight + acts["working"]
        loss = 0.0
        if stage in ("only", "first"):
            activations += 8 * s * b * in_flight
        if stage in ("only", "last"):
            loss = 2 * s * b * shape.dim + LOSS_PEAK_BYTES_PER_LOGIT * s * b * shape.vocab_size / layout.tp
        row = MemoryBreakdown(params, grads, optimizer, activations, buffers, loss, stage, in_flight)
        if best is None or row.total > best.total:
            best = row
    return best
