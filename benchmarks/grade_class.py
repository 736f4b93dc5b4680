"""How long grading a class takes: N correct submissions (copies of solutions/), with 1 and with 2 jobs.

    python benchmarks/grade_class.py [--students 6] [--jobs 1 2] [--exercises ex00,ex01]

Each student is graded by its own judge process (pytest, which imports torch: a few seconds) under the
full sandbox the machine allows, so the time per student is mostly that start-up plus the tests themselves.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_lib.tables import print_table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=6)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--exercises", default=None, help="e.g. ex00 (default: every exercise)")
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        submissions = Path(scratch) / "submissions"
        for n in range(options.students):
            shutil.copytree(ROOT / "solutions", submissions / f"student{n:03d}" / "exercises",
                            ignore=shutil.ignore_patterns("__pycache__"))
        for jobs in options.jobs:
            out = Path(scratch) / f"out-{jobs}"
            command = [sys.executable, "-m", "course_lib.grade", str(submissions), "--out", str(out),
                       "--jobs", str(jobs), "--no-progress"]
            if options.exercises:
                command += ["--exercises", options.exercises]
            started = time.perf_counter()
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
            seconds = time.perf_counter() - started
            if done.returncode != 0:
                sys.exit(f"grading failed:\n{done.stdout}\n{done.stderr}")
            with open(out / "grades.csv", newline="") as handle:
                grades = list(csv.DictReader(handle))
            full = sum(r["status"] == "ok" and r["total"] == r["possible"] for r in grades)
            per_student = sorted(float(r["seconds"]) for r in grades)
            rows.append([jobs, len(grades), f"{seconds:.1f}", f"{seconds / len(grades):.1f}",
                         f"{per_student[len(per_student) // 2]:.1f}", f"{full}/{len(grades)}",
                         grades[0]["possible"]])
    print(f"Grading {options.students} correct submissions ({options.exercises or 'every exercise'}), "
          f"{len(os.sched_getaffinity(0))} cores, as {'root' if os.geteuid() == 0 else 'a normal user'}")
    print_table(["jobs", "students", "wall s", "wall s / student", "median s in judge", "full marks", "points"],
                rows)


if __name__ == "__main__":
    main()
