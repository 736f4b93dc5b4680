"""The planner beside every published run it is checked against (lesson 09, notebooks/09_putting_it_together.ipynb).

    compare_with_published(mfu=ASSUMED_MFU) -> (rows, terms)   one row per PUBLISHED run: predicted and published
                                                               GiB and tokens/s per GPU, their gaps, and why
    HEADER, TERMS_HEADER                                       the columns of those rows

The planner predicts *allocated* bytes; torchtitan logs the caching allocator's peak *reserved* bytes, which hold
its cache and fragmentation on top (published.py). The planner prices eager bf16: torch.compile, Float8 and async
TP are not modelled, so a row that used them is faster and leaner than predicted. Float8 rows have no defined MFU:
their "MFU" column divides by the bf16 peak and is marked "bf16-eq." (research/lesson-09.md §1.2).
`benchmarks/planner_vs_published.py` prints them.
"""

from __future__ import annotations

from course_lib.parallel.planner.memory import GiB, memory_per_gpu
from course_lib.parallel.planner.published import PUBLISHED, PublishedRun
from course_lib.parallel.planner.step_time import ASSUMED_MFU, mfu, step_time

__all__ = ["compare_with_published", "HEADER", "TERMS_HEADER"]

TERMS_HEADER = ["table", "run", "stage", "in flight", "params", "grads", "optimizer", "activations",
                "fsdp buffers", "loss", "total (GiB)"]
HEADER = ["table", "run", "GiB pred", "GiB pub", "gap", "tok/s pred", "tok/s pub", "gap", "MFU pub", "why"]


def _memory_why(run: PublishedRun, gap: float) -> str:
    """Why predicted and published memory differ, from what the row says it used."""
    if run.memory_gib is None:
        return "mem: not published"
    unmodelled = [t for t in ("compile", "Float8", "AsyncTP") if t in run.techniques]
    if abs(gap) <= 0.05:  # what a row within 5 % leaves out; how much each term weighs was not measured apart
        parts = ["within 5%", "pub is reserved"] + (["/".join(unmodelled) + " not modelled"] if unmodelled else [])
    elif gap < 0:
        parts = ["pub is reserved: + allocator cache"]
        if "AsyncTP" in run.techniques:
            parts.append("AsyncTP's symmetric-memory buffers")
        if run.layout.cp == 8 and run.layout.pp > 1:
            parts.append("CP-8 ring buffers")
    else:
        parts = ["over: " + ("/".join(unmodelled) + " keep less" if unmodelled else "see --terms")]
        if run.layout.pp > 1:
            parts.append("m, v assumed")
    return "mem: " + ", ".join(parts)


def _speed_why(run: PublishedRun, published_mfu: float, step) -> str:
    """Why predicted and published throughput differ."""
    parts = [f"ran at {100 * published_mfu:.1f}% MFU, model {100 * step.mfu_predicted:.1f}%"]
    if "Float8" in run.techniques:
        parts.append("Float8 (2x peak) not modelled")
    elif "compile" in run.techniques:
        parts.append("compile not modelled")
    if "AsyncTP" in run.techniques:
        parts.append("AsyncTP hides TP comm")
    if run.layout.pp > 1:
        parts.append(f"bubble {100 * step.bubble:.0f}% at assumed m={run.layout.n_microbatches}")
    if step.exposed_comm_s > 0.05 * step.step_s:
        parts.append(f"exposed comm {100 * step.exposed_comm_s / step.step_s:.0f}%")
    if run.table.startswith("A100"):
        parts.append("A100 links assumed")
    return "tok/s: " + ", ".join(parts)


def compare_with_published(mfu_assumed: float = ASSUMED_MFU) -> tuple[list[list], list[list]]:
    """(table rows, memory-term rows) for every published run."""
    table, terms = [], []
    for run in PUBLISHED:
        memory = memory_per_gpu(run.shape, run.layout, run.seq_len)
        step = step_time(run.shape, run.layout, run.cluster, run.seq_len, mfu=mfu_assumed)
        published_mfu = mfu(run.tokens_per_s_per_gpu, run.shape, run.seq_len, run.cluster.peak_flops,
                            exclude_embedding=not run.counts_embedding)
        predicted_gib = memory.total / GiB
        if run.memory_gib is None:
            gib_pub, mem_gap_text, mem_gap = "-", "-", 0.0
        else:
            mem_gap = (predicted_gib - run.memory_gib) / run.memory_gib
            gib_pub, mem_gap_text = f"{run.memory_gib:.1f}", f"{100 * mem_gap:+.0f}%"
        speed_gap = (step.tokens_per_s_per_gpu - run.tokens_per_s_per_gpu) / run.tokens_per_s_per_gpu
        mfu_text = f"{100 * published_mfu:.1f}%" + (" bf16-eq." if "Float8" in run.techniques else "")
        why = _memory_why(run, mem_gap) + "; " + _speed_why(run, published_mfu, step)
        table.append([run.table, run.label, f"{predicted_gib:.1f}", gib_pub, mem_gap_text,
                      f"{step.tokens_per_s_per_gpu:,.0f}", f"{run.tokens_per_s_per_gpu:,.0f}",
                      f"{100 * speed_gap:+.0f}%", mfu_text, why])
        terms.append([run.table, run.label, memory.stage, f"{memory.in_flight:g}",
                      *(f"{v:.1f}" for v in memory.gib().values())])
    return table, terms
