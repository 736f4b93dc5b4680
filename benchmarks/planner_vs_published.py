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

from course_lib.parallel.planner import ASSUMED_MFU, PUBLISHED  # noqa: E402
from course_lib.parallel.planner.comparison import HEADER, TERMS_HEADER, compare_with_published  # noqa: E402
from course_lib.tables import print_table  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mfu", type=float, default=ASSUMED_MFU,
                        help=f"the MFU the planner assumes (default {ASSUMED_MFU}, an assumption)")
    parser.add_argument("--terms", action="store_true", help="also print each row's memory breakdown")
    args = parser.parse_args(argv)
    table, terms = compare_with_published(args.mfu)
    print(f"planner (eager bf16, allocated peak, compute at {100 * args.mfu:.0f}% MFU) vs published "
          "(reserved peak, measured tokens/s per GPU)")
    print_table(HEADER, table)
    if args.terms:
        print()
        print_table(TERMS_HEADER, terms)
    print("\nsources:", "; ".join(sorted({str(run.source) for run in PUBLISHED})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
