"""Lesson 09's planner beside every published run it is checked against (course_lib.parallel.planner.PUBLISHED).

    python3 course.py python benchmarks/planner_vs_published.py [--mfu 0.40] [--terms]

A benchmark of a model, not of a machine: plain arithmetic, a second or so on any CPU. For each row of torchtitan's
Llama 3.1 tables (H100, Dec 2024) and its earlier A100 and 405B tables it prints the planner's peak memory per
GPU (the most loaded GPU, memory_per_gpu) beside the published GiB and their gap, the planner's tokens/s per GPU
at the stated MFU (step_time) beside the published ones, the MFU the published throughput means under
torchtitan's FLOP count of its date (mfu: embedding excluded since May 2024, counted before), and why the two
differ. --terms adds the memory breakdown of each row.

The planner predicts *allocated* bytes; torchtitan logs the caching allocator's peak *reserved* bytes, which hold
its cache and fragmentation on top (published.py). The planner prices eager bf16: torch.compile, Float8 and async
TP are not modelled, so a row that used them is faster and leaner than predicted. Float8 rows have no defined MFU:
their "MFU" column divides by the bf16 peak and is marked "bf16-eq." (research/lesson-09.md §1.2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_lib.parallel.planner import (ASSUMED_MFU, PUBLISHED, GiB, PublishedRun, memory_per_gpu, mfu,  # noqa: E402
                                         step_time)
from course_lib.tables import print_table  # noqa: E402

HEADER = ["table", "run", "GiB pred", "GiB pub", "gap", "tok/s pred", "tok/s pub", "gap", "MFU pub", "why"]


def _memory_why(run: PublishedRun, gap: float) -> str:
    """Why predicted and published memory differ, from what the row says it used."""
    if run.memory_gib is None:
        return "mem: not published"
    unmodelled = [t for t in ("compile", "Float8", "AsyncTP") if t in run.techniques]
    if abs(gap) <= 0.05:
        parts = ["within 5%"] + (["allocator cache and " + "/".join(unmodelled) + " effects cancel"]
                                 if unmodelled else ["+ allocator cache"])
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


def rows(mfu_assumed: float) -> tuple[list[list], list[list]]:
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mfu", type=float, default=ASSUMED_MFU,
                        help=f"the MFU the planner assumes (default {ASSUMED_MFU}, an assumption)")
    parser.add_argument("--terms", action="store_true", help="also print each row's memory breakdown")
    args = parser.parse_args(argv)
    table, terms = rows(args.mfu)
    print(f"planner (eager bf16, allocated peak, compute at {100 * args.mfu:.0f}% MFU) vs published "
          "(reserved peak, measured tokens/s per GPU)")
    print_table(HEADER, table)
    if args.terms:
        print()
        print_table(["table", "run", "stage", "in flight", "params", "grads", "optimizer", "activations",
                     "fsdp buffers", "loss", "total (GiB)"], terms)
    print("\nsources:", "; ".join(sorted({str(run.source) for run in PUBLISHED})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
