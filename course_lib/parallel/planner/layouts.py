"""Every layout a model can run with on a cluster, those that fit, ranked by predicted throughput (lesson 09).

    enumerate_layouts(shape, cluster, global_batch, seq_len)   every valid Layout for the GPU count and batch
    rank_layouts(shape, cluster, global_batch, seq_len)        Plans that fit in memory, fastest first
    Plan, PLAN_HEADER, plan_rows(plans)                        one row per plan for course_lib.tables.print_table

Valid means: the degrees multiply to the cluster's GPUs; TP stays inside a node and divides the query and KV heads;
PP (× virtual stages) divides the layers; CP leaves two chunks per rank of the sequence (the load-balanced causal
split); EP divides the experts and borrows its ranks from dp_shard × cp × tp (torchtitan); the global batch splits
evenly over the data-parallel ranks and into micro-batches; a 1F1B pipeline has at least pp micro-batches, an
interleaved one a multiple of pp. Fitting means memory_per_gpu's peak is at most `headroom` of the GPU's memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

from course_lib.parallel import whole_number
from course_lib.parallel.planner.inputs import CHECKPOINTING, Cluster, Layout, ModelShape
from course_lib.parallel.planner.memory import GiB, MemoryBreakdown, memory_per_gpu
from course_lib.parallel.planner.step_time import ASSUMED_MFU, StepTime, step_time

__all__ = ["ASSUMED_HEADROOM", "enumerate_layouts", "rank_layouts", "Plan", "PLAN_HEADER", "plan_rows"]

# An assumption, not a measurement: keep a tenth of the GPU's memory for what the model leaves out (the caching
# allocator's cache and fragmentation, the CUDA context, NCCL's buffers); torchtitan's tables report reserved bytes.
ASSUMED_HEADROOM = 0.90


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _schedules(pp: int, m: int, layers: int, schedules: Sequence[str], v: int) -> list[tuple[str, int]]:
    """The (schedule, virtual stages) pairs a pipeline of pp stages and m micro-batches can run."""
    if pp == 1:
        return [("1f1b", 1)]
    out = []
    for kind in schedules:
        if kind == "interleaved":
            if m % pp == 0 and layers % (pp * v) == 0 and v > 1:
                out.append((kind, v))
        elif kind == "gpipe" or m >= pp:
            out.append((kind, 1))
    return out


def enumerate_layouts(shape: ModelShape, cluster: Cluster, global_batch: int, seq_len: int, *,
                      checkpointing: Sequence[str] = CHECKPOINTING, schedules: Sequence[str] = ("1f1b", "interleaved"),
                      zero_stages: Sequence[int] = (3,), virtual_stages: int = 2,
                      max_micro_batch: int = 16) -> Iterator[Layout]:
    """Every valid Layout (the module's rules) of `cluster`'s GPUs for global_batch sequences of seq_len tokens.

    checkpointing, schedules and zero_stages: the choices tried; interleaved pipelines use `virtual_stages` stages
    per GPU; micro-batches hold 1 to max_micro_batch sequences. Sequence parallelism is on wherever tp > 1.
    """
    n, batch = cluster.n_gpus, whole_number(global_batch, "global_batch")
    seq_len = whole_number(seq_len, "seq_len")
    for name in checkpointing:
        if name not in CHECKPOINTING:
            raise ValueError(f"checkpointing choices are {CHECKPOINTING}, not {name!r}")
    for tp in _divisors(cluster.gpus_per_node):
        if n % tp or shape.n_heads % tp or shape.n_kv_heads % tp:
            continue
        for pp in (p for p in _divisors(n // tp) if shape.n_layers % p == 0):
            for cp in (c for c in _divisors(n // (tp * pp)) if c == 1 or seq_len % (2 * c) == 0):
                dp = n // (tp * pp * cp)
                if batch % dp:
                    continue
                local = batch // dp
                for dp_replicate in _divisors(dp):
                    dp_shard = dp // dp_replicate
                    experts = [e for e in _divisors(shape.n_experts) if (dp_shard * cp * tp) % e == 0] \
                        if shape.n_experts else [1]
                    for micro in (b for b in _divisors(local) if b <= max_micro_batch):
                        m = local // micro
                        for (kind, v) in _schedules(pp, m, shape.n_layers, schedules, virtual_stages):
                            for ep in experts:
                                for ckpt in checkpointing:
                                    for zero in zero_stages:
                                        yield Layout(dp_replicate, dp_shard, tp, pp, cp, ep, micro, m, ckpt, zero,
                                                     True, kind, v)


@dataclass(frozen=True)
class Plan:
    """A layout with its predicted memory (most loaded GPU) and step, and whether it fits."""

    layout: Layout
    memory: MemoryBreakdown
    step: StepTime
    fits: bool


def rank_layouts(shape: ModelShape, cluster: Cluster, global_batch: int, seq_len: int, *, mfu: float = ASSUMED_MFU,
                 headroom: float = ASSUMED_HEADROOM, top: int | None = None, include_misfits: bool = False,
                 **choices) -> list[Plan]:
    """The layouts of enumerate_layouts (`choices` are its keyword arguments) priced by memory_per_gpu and
    step_time, those that fit within headroom × the GPU's memory (all of them with include_misfits=True), by
    predicted tokens/s per GPU, fastest first (then the least communication before overlap, then the least
    memory); the first `top` of them if given."""
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be a fraction of the GPU's memory in (0, 1], not {headroom!r}")
    plans = []
    for layout in enumerate_layouts(shape, cluster, global_batch, seq_len, **choices):
        memory = memory_per_gpu(shape, layout, seq_len)
        fits = memory.total <= headroom * cluster.memory_bytes
        if fits or include_misfits:
            plans.append(Plan(layout, memory, step_time(shape, layout, cluster, seq_len, mfu=mfu), fits))
    plans.sort(key=lambda p: (-round(p.step.tokens_per_s_per_gpu, 6), sum(p.step.comm_s.values()), p.memory.total))
    return plans[:top] if top is not None else plans


PLAN_HEADER = ["dp_rep", "dp_shard", "tp", "pp", "cp", "ep", "micro×m", "AC", "schedule", "GiB/GPU", "fits",
               "tok/s/GPU", "MFU %", "bubble %", "exposed comm s"]


def plan_rows(plans: Sequence[Plan]) -> list[list]:
    """Rows under PLAN_HEADER, one per plan, for course_lib.tables.print_table."""
    rows = []
    for p in plans:
        lay = p.layout
        schedule = "-" if lay.pp == 1 else (f"interleaved v={lay.virtual_stages}" if lay.virtual_stages > 1
                                            else lay.pp_schedule)
        rows.append([lay.dp_replicate, lay.dp_shard, lay.tp, lay.pp, lay.cp, lay.ep,
                     f"{lay.micro_batch}×{lay.n_microbatches}", lay.activation_checkpointing, schedule,
                     f"{p.memory.total / GiB:.1f}", "yes" if p.fits else "no", f"{p.step.tokens_per_s_per_gpu:,.0f}",
                     f"{100 * p.step.mfu_predicted:.1f}", f"{100 * p.step.bubble:.1f}",
                     f"{p.step.exposed_comm_s:.3f}"])
    return rows
