"""How long grading a class takes: N correct submissions (copies of solutions/), by jobs and by kind of sandbox.

    python benchmarks/grade_class.py [--students 6] [--loopers 0] [--jobs 1 2] [--exercises ex00,ex01]
                                     [--isolation auto unshare] [--repeat 1] [-- more grader options]

`--loopers K` adds K students whose every function loops forever (the stubs, each `raise NotImplementedError`
replaced by `while True: pass`): the "slowest s" column shows what such a student costs (a looping function
costs its own tests: course_lib/grading/loops.py). After the table, each run's students: their time in the judge,
in its start and in each exercise's tests, and the grader's detail (which functions ran out of time).

Each student is graded by its own judge process (pytest, forked from a process that imported pytest, Hypothesis and
torch once for the class: course_lib/instructor/grade/judge_zygote.py) under the sandbox asked for (`auto`:
bubblewrap's allow-list where it works; `unshare`: the fallback, a mount namespace that hides the known secrets, as
the grader did before bubblewrap, whose judges each start Python and import torch), so the time per student is
mostly that start-up (the sandbox's fork server imports torch for each student) plus the tests themselves.
Configurations alternate when repeated, so a change in the machine's load falls on all of them. The reference
solutions' calibration is cached after the first run of each kind of sandbox (the first row of each may include it:
see the "reference" column).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_lib.instructor.exercises import expected_stubs  # noqa: E402
from course_lib.tables import print_table  # noqa: E402


def looping_submission(folder: Path) -> None:
    """Every exercise, with every function body an infinite loop."""
    folder.mkdir(parents=True)
    for name, stub in expected_stubs(ROOT / "solutions").items():
        looped = re.sub(r"^(\s+)raise NotImplementedError\(.*?\)$", r"\1while True:\n\1    pass", stub,
                        flags=re.M | re.S)
        (folder / name).write_text(looped)


def grade_once(submissions: Path, out: Path, jobs: int, isolation: str, exercises: str | None,
               extra: list[str]) -> list:
    command = [sys.executable, "-m", "course_lib.grade", str(submissions), "--out", str(out), "--jobs", str(jobs),
               "--isolation", isolation, "--no-progress", *extra]
    if isolation in ("unshare", "none") and "--allow-weak-isolation" not in extra:
        command.append("--allow-weak-isolation")  # the grader refuses a weaker sandbox unless told: here, to compare
    if exercises:
        command += ["--exercises", exercises]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"grading failed:\n{done.stdout}\n{done.stderr}")
    with open(out / "grades.csv", newline="") as handle:
        grades = list(csv.DictReader(handle))
    limits = out / "time_limits.json"
    reference = "none"
    if limits.exists():
        info = json.loads(limits.read_text())
        reference = "cached" if info["cached"] else f"{info['reference_seconds']:.0f} s"
    full = sum(r["status"] == "ok" and r["total"] == r["possible"] for r in grades)
    per_student = sorted(float(r["seconds"]) for r in grades)
    calibration = 0.0 if reference in ("none", "cached") else float(reference.split()[0])
    # 100 students: the calibration once, then the students at the rate measured here (wall less calibration).
    projected = calibration + 100 * max(0.0, seconds - calibration) / len(grades)
    breakdown = {}
    for row in grades:
        results = json.loads((out / row["student"] / "results.json").read_text())
        data = results["extra_data"]
        detail = row.get("detail", "")
        if row["student"].startswith("student") and row["total"] != row["possible"]:
            # A correct submission that lost points: which tests, and why (a time limit on a loaded machine?)
            lost = [f"{t['name']}: {t['output'].strip().splitlines()[0] if t['output'].strip() else t['status']}"
                    for t in results["tests"] if t.get("score", 0) < t.get("max_score", 0)]
            detail = "; ".join([detail, *lost] if detail else lost)
        breakdown[row["student"]] = (row["status"], float(row["seconds"]), row["total"], row["possible"],
                                     data.get("seconds_per_exercise", {}), detail)
    shutil.rmtree(out)
    return [isolation, jobs, len(grades), f"{seconds:.1f}", f"{seconds / len(grades):.1f}",
            f"{per_student[len(per_student) // 2]:.1f}", f"{per_student[-1]:.1f}", f"{full}/{len(grades)}",
            grades[0]["possible"], reference, f"{projected / 60:.1f}", f"{load:.1f}"], breakdown


def print_breakdown(label: str, breakdown: dict) -> None:
    """Each student's time in its judge, and in each exercise's tests (the judge's start is the difference)."""
    exercises = sorted({e for *_, per, _ in breakdown.values() for e in per})
    rows = []
    for student, (status, seconds, total, possible, per, detail) in breakdown.items():
        tests = sum(per.values())
        rows.append([student, status, f"{total}/{possible}", f"{seconds:.1f}", f"{seconds - tests:.1f}",
                     *(f"{per.get(e, 0.0):.1f}" for e in exercises)])
    print(f"\n{label}: seconds per student, in the judge's start and in each exercise's tests")
    print_table(["student", "status", "points", "judge s", "start s", *exercises], rows)
    for student, (*_, detail) in breakdown.items():
        if detail:
            print(f"  {student}: {detail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=6)
    parser.add_argument("--loopers", type=int, default=0, help="students whose every function loops forever")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--exercises", default=None, help="e.g. ex00 (default: every exercise)")
    parser.add_argument("--isolation", nargs="+", default=["auto"], help="auto, bwrap, unshare or none (several: compare)")
    parser.add_argument("--repeat", type=int, default=1)
    options, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    rows, breakdowns = [], []
    with tempfile.TemporaryDirectory() as scratch:
        submissions = Path(scratch) / "submissions"
        for n in range(options.students):
            shutil.copytree(ROOT / "solutions", submissions / f"student{n:03d}" / "exercises",
                            ignore=shutil.ignore_patterns("__pycache__", "wrong_answers"))
        for n in range(options.loopers):
            looping_submission(submissions / f"looper{n:03d}" / "exercises")
        for _ in range(options.repeat):
            for jobs in options.jobs:
                for isolation in options.isolation:
                    row, breakdown = grade_once(submissions, Path(scratch) / "out", jobs, isolation,
                                                options.exercises, extra)
                    rows.append(row)
                    breakdowns.append((f"{isolation}, --jobs {jobs}", breakdown))
    print(f"Grading {options.students} correct submissions"
          + (f" and {options.loopers} that loop everywhere" if options.loopers else "")
          + f" ({options.exercises or 'every exercise'}), "
          f"{len(os.sched_getaffinity(0))} cores, as {'root' if os.geteuid() == 0 else 'a normal user'}"
          + (f", grader options {' '.join(extra)}" if extra else ""))
    print_table(["isolation", "jobs", "students", "wall s", "wall s / student", "median s in judge", "slowest s",
                 "full marks", "points", "reference", "100 students, min", "load"], rows)
    print("(100 students, min: the calibration once, then 100 students at this run's rate, loopers included: "
          "without --loopers, a class of correct students; wall s includes the calibration unless cached)")
    for label, breakdown in breakdowns:
        print_breakdown(label, breakdown)


if __name__ == "__main__":
    main()
