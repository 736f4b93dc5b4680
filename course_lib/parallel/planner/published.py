"""Published training runs the planner is checked against, as data, each with its source (lesson 09).

    Source        a repository, file and commit
    PublishedRun  one row of a published table: the model, machine, layout, sequence length, what was measured, the
                  conditions as the source gives them, and what the planner has to assume that the row does not say
    PUBLISHED     every row: torchtitan's Llama 3.1 tables 1–6 (H100, Dec 2024) and its earlier A100 and 405B tables

Copied from `shared/research/lesson-09.md` §1.1–1.2, which read them in pytorch/torchtitan. Only rows that note marks
verified are here (the Megatron-LM weak-scaling transcription and the TorchTitan paper's tables are UNVERIFIED and
left out). Memory is torchtitan's logged `max_reserved_gib` (the caching allocator's peak reserved bytes, `train.py`
@9dec370 line 393); that the tables report that counter is not stated in them (UNVERIFIED link), so compare a
prediction of allocated bytes with it knowing the allocator's cache is on top. "TPS/GPU" is tokens per second per GPU
read at the 90th iteration. `benchmarks/planner_vs_published.py` sets the planner beside every row.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.parallel.planner.inputs import (A100_80GB_CLUSTER, H100_GRAND_TETON, LLAMA31_8B, LLAMA31_70B,
                                                LLAMA31_405B, Cluster, Layout, ModelShape)

__all__ = ["Source", "PublishedRun", "PUBLISHED", "TITAN_TABLES", "TITAN_EARLIER"]


@dataclass(frozen=True)
class Source:
    repo: str
    path: str
    commit: str
    note: str = ""

    def __str__(self) -> str:
        return f"{self.repo} {self.path} @{self.commit[:8]}" + (f" ({self.note})" if self.note else "")


TITAN_TABLES = Source("pytorch/torchtitan", "benchmarks/llama3_h100_202412_torchtitan.md",
                      "820504e20d1149fbf0b98c567af24c4b0433b22d",
                      "numbers unchanged since docs/performance.md @d4c86e37, 2025-01-30; measured with torch 1963fc8, "
                      "torchao eab345c, torchtitan 9dec370, Dec 2024")
TITAN_EARLIER = Source("pytorch/torchtitan", "docs/performance.md", "4d88a8a44fe439f73f564b83d60b29a906ef3507",
                       "2024-12-03; the 405B row corrected in @3faaa1a0, 'Fix the performance number for 405B (#556)'")

_H100 = ("Grand Teton: 8 H100 per host 'fully connected with NVLink', '96GB HBM2e', 'backend RDMA network with 400 "
         "Gb/s per GPU', 500 W power limit; TPS/GPU read at iteration 90; memory the maximum over all GPUs")
_SEQ_8B = "seq_len 8192: train_configs/llama3_8b.toml @9dec370 (the tables do not give it)"
_SEQ_BIG = ("seq_len 8192 ASSUMED: the tables do not give it; train_configs/llama3_70b.toml @08e53794 and "
            "llama3_405b.toml @057f64d5 (not the benchmark's commit) have 8192")
_M_PP = ("n_microbatches = pp = 8 ASSUMED: the table does not give it; torchtitan's default "
         "(pipeline_parallel_microbatches None -> pipeline_parallel_degree, pipelining_utils.py of that era)")


@dataclass(frozen=True)
class PublishedRun:
    """One published measurement with the layout that reproduces its conditions.

    tokens_per_s_per_gpu, memory_gib (None where not published) and mfu_percent (None where not published) are the
    source's; techniques: what the run used beyond eager bf16 (torch.compile, Float8, AsyncTP), which the planner
    does not model; assumed: what the planner had to assume (sequence length, micro-batches, virtual stages).
    counts_embedding: whether torchtitan's FLOP count of that date included the embedding (before 2024-05-01).
    """

    table: str
    label: str
    shape: ModelShape
    cluster: Cluster
    layout: Layout
    seq_len: int
    tokens_per_s_per_gpu: float
    memory_gib: float | None
    mfu_percent: float | None
    techniques: tuple[str, ...]
    conditions: str
    assumed: str
    source: Source
    counts_embedding: bool = False


def _titan_rows() -> list[PublishedRun]:
    """Tables 1–6 of benchmarks/llama3_h100_202412_torchtitan.md."""
    h100 = H100_GRAND_TETON
    rows = []
    t1 = "1D (FSDP), Llama 3.1 8B, 8 GPUs, local batch 2, global 16, selective AC (op); " + _H100
    t3 = "1D (FSDP), Llama 3.1 8B, 128 GPUs, local batch 2, global 256, selective AC (op); " + _H100
    for table, conditions, nodes, fsdp, runs in [
            ("Table 1", t1, 1, 8, [("FSDP", 5762, 82.4, ()), ("FSDP + torch.compile", 6667, 77.0, ("compile",)),
                                   ("FSDP + torch.compile + Float8", 8532, 76.8, ("compile", "Float8"))]),
            ("Table 3", t3, 16, 128, [("FSDP", 5605, 67.0, ()), ("FSDP + torch.compile", 6514, 62.0, ("compile",)),
                                      ("FSDP + torch.compile + Float8", 8380, 61.8, ("compile", "Float8"))])]:
        for label, tps, gib, tech in runs:
            rows.append(PublishedRun(table, label, LLAMA31_8B, h100.with_nodes(nodes),
                                     Layout(dp_shard=fsdp, micro_batch=2, activation_checkpointing="selective"),
                                     8192, tps, gib, None, tech, conditions, _SEQ_8B, TITAN_TABLES))
    t2 = "FSDP + CP + torch.compile + Float8, Llama 3.1 8B, 8 GPUs, local batch 1, full AC; " + _H100
    for fsdp, cp, seq, tps, gib in [(8, 1, 32768, 3890, 83.9), (4, 2, 65536, 2540, 84.2), (2, 4, 131072, 1071, 84.0),
                                    (1, 8, 262144, 548, 84.5)]:
        rows.append(PublishedRun("Table 2", f"FSDP {fsdp}, CP {cp}, seq {seq}", LLAMA31_8B, h100,
                                 Layout(dp_shard=fsdp, cp=cp, activation_checkpointing="full"), seq, tps, gib, None,
                                 ("compile", "Float8"), t2, "", TITAN_TABLES))
    t4 = ("2D (FSDP 32, TP 8) + torch.compile + Float8, Llama 3.1 70B, 256 GPUs, local batch 16, global 512, "
          "full AC; " + _H100)
    for label, tps, gib, tech in [("2D", 829, 71.9, ("compile", "Float8")),
                                  ("2D + AsyncTP", 876, 67.6, ("compile", "Float8", "AsyncTP"))]:
        rows.append(PublishedRun("Table 4", label, LLAMA31_70B, h100.with_nodes(32),
                                 Layout(dp_shard=32, tp=8, micro_batch=16, activation_checkpointing="full"), 8192,
                                 tps, gib, None, tech, t4, _SEQ_BIG, TITAN_TABLES))
    t5 = ("3D (FSDP 8, TP 8, PP 8) + torch.compile + Float8 + AsyncTP, Llama 3.1 405B, 512 GPUs, local batch 32, "
          "global 256, full AC; " + _H100)
    big = ("compile", "Float8", "AsyncTP")
    for label, tps, gib, schedule, v in [("1F1B", 100, 82.5, "1f1b", 1), ("Interleaved 1F1B", 128, 72.7,
                                                                           "interleaved", 2)]:
        assumed = _SEQ_BIG + "; " + _M_PP + ("; virtual_stages = 2 ASSUMED (not published)" if v > 1 else "")
        rows.append(PublishedRun("Table 5", label, LLAMA31_405B, h100.with_nodes(64),
                                 Layout(dp_shard=8, tp=8, pp=8, micro_batch=4, n_microbatches=8,
                                        activation_checkpointing="full", pp_schedule=schedule, virtual_stages=v),
                                 8192, tps, gib, None, big, t5, assumed, TITAN_TABLES))
    t6 = ("4D (FSDP, TP 8, PP 8, CP) + torch.compile + Float8 + AsyncTP + 1F1B, Llama 3.1 405B, 512 GPUs, local "
          "batch 8, full AC; " + _H100)
    for fsdp, cp, seq, tps, gib in [(8, 1, 32768, 76, 75.3), (4, 2, 65536, 47, 75.9), (2, 4, 131072, 31, 77.1),
                                    (1, 8, 262144, 16, 84.9)]:
        rows.append(PublishedRun("Table 6", f"FSDP {fsdp}, CP {cp}, seq {seq}", LLAMA31_405B, h100.with_nodes(64),
                                 Layout(dp_shard=fsdp, cp=cp, tp=8, pp=8, micro_batch=1, n_microbatches=8,
                                        activation_checkpointing="full"), seq, tps, gib, None, big, t6, _M_PP,
                                 TITAN_TABLES))
    return rows


def _earlier_rows() -> list[PublishedRun]:
    """The earlier docs/performance.md's A100 and 405B tables (throughput only)."""
    rows = []
    a100 = ("Llama 3 on 64 A100 (80GB) GPUs, FSDP2, local batch 1 (global 64), WPS per GPU; the machine's links "
            "are not described")
    for label, shape, tps, pct, ckpt in [("8B, selective layer AC", LLAMA31_8B, 2904, 56.8, "selective"),
                                         ("8B, selective op AC", LLAMA31_8B, 2973, 58.2, "selective"),
                                         ("70B, full AC", LLAMA31_70B, 331, 51.7, "full")]:
        rows.append(PublishedRun("A100 (earlier)", label, shape, A100_80GB_CLUSTER,
                                 Layout(dp_shard=64, activation_checkpointing=ckpt), 8192, tps, None, pct, (),
                                 a100, "seq_len 8192 ASSUMED (the table does not give it; the MFU reproduces with "
                                 "it); per-layer SAC priced as per-op SAC", TITAN_EARLIER, counts_embedding=True))
    h405 = ("Llama 3.1 405B on 128 H100 GPUs, 2D (FSDP2 16 + TP 8), local batch 2 (global 32), full AC; the "
            "Float8 rows' MFU divides by an fp8 peak (1979e12, inferred, not stated)")
    for label, tps, pct, tech in [("405B, bf16", 109, 29.0, ()), ("405B, Float8", 177, 23.46, ("Float8",)),
                                  ("405B, Float8 + AsyncTP", 185, 24.52, ("Float8", "AsyncTP"))]:
        rows.append(PublishedRun("405B H100 (earlier)", label, LLAMA31_405B, H100_GRAND_TETON.with_nodes(16),
                                 Layout(dp_shard=16, tp=8, micro_batch=2, activation_checkpointing="full"), 8192,
                                 tps, None, pct, tech, h405, _SEQ_BIG + "; machine ASSUMED to be Grand Teton",
                                 TITAN_EARLIER))
    return rows


PUBLISHED: tuple[PublishedRun, ...] = tuple(_titan_rows() + _earlier_rows())
