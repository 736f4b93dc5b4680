"""The grader's command line: `python -m course_lib.grade SUBMISSIONS --out OUT` (see the package's docstring)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from course_lib import stopping
from course_lib.grading import time_rule
from course_lib.instructor.grade.classroom import GradeOptions, grade_class
from course_lib.instructor.grade.report import STATUSES


def _usage() -> str:
    import course_lib.instructor.grade as package

    return package.__doc__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 course.py grade", description=_usage(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submissions", type=Path, help="folder with one folder or .zip per student")
    parser.add_argument("--out", type=Path, required=True, help="where grades.csv and each student's results go")
    parser.add_argument("--jobs", type=int, default=1, help="students graded at once (default 1)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for one student's whole run (default 900)")
    parser.add_argument("--test-timeout", type=float, default=time_rule.CEILING,
                        help="seconds for a test: the most a calibrated limit may be, and every test's limit "
                             "without calibration (default 120)")
    parser.add_argument("--tests", type=Path, default=None, help="folder of hidden tests (test_exNN_*.py), graded as hidden")
    parser.add_argument("--exercises", default=None, help="grade only these, e.g. ex00,ex01 (default: all)")
    parser.add_argument("--memory-gb", type=float, default=4.0,
                        help="memory of all of one student's processes together, in GiB (default 4): a memory cgroup "
                             "where the grader can make one (root), else a watchdog on resident memory")
    parser.add_argument("--address-space-gb", type=float, default=None,
                        help="address-space limit of each student process in GiB; 0 for none (default 6, none on a "
                             "CUDA machine, where CUDA reserves more than any useful limit; importing torch takes 3.3)")
    parser.add_argument("--max-processes", type=int, default=256,
                        help="processes and threads a student may have at once (default 256; needs root)")
    parser.add_argument("--gpu-memory-fraction", type=float, default=None,
                        help="cap PyTorch's allocator at this fraction of each GPU in every student process "
                             "(default 0.9 / --jobs where there are GPUs; advisory)")
    parser.add_argument("--isolation", choices=["auto", "bwrap", "unshare", "none"], default="auto",
                        help="auto (default): bubblewrap's allow-list where it works, else the unshare fallback "
                             "(hides only the known secrets); the others force one, to compare")
    parser.add_argument("--allow-weak-isolation", action="store_true",
                        help="grade even without bubblewrap (--isolation unshare or none, or auto falling back to "
                             "them), where student code can read other copies of the course; refused otherwise")
    parser.add_argument("--memory-limiter", choices=["auto", "cgroup", "watchdog"], default="auto",
                        help="how --memory-gb is enforced (default: a cgroup where possible, else the watchdog)")
    parser.add_argument("--no-calibration", action="store_true",
                        help="no reference run: every test gets --test-timeout")
    parser.add_argument("--time-factor", type=float, default=time_rule.FACTOR,
                        help="a test's limit is this many times the reference solution's time (default 4)")
    parser.add_argument("--time-floor", type=float, default=time_rule.FLOOR, help="... and at least this many seconds (default 3)")
    parser.add_argument("--recalibrate", action="store_true", help="grade the reference again, not from the cache")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["gradescope"]:  # the Gradescope package: `python -m course_lib.grade gradescope --out ...`
        from course_lib.instructor.grade.gradescope import main as gradescope

        return gradescope(argv[1:])
    parser = _parser()
    options = parser.parse_args(argv)
    if not options.submissions.is_dir():
        parser.error(f"{options.submissions} is not a folder")
    if options.tests is not None and not options.tests.is_dir():
        parser.error(f"--tests {options.tests} is not a folder")
    if options.jobs < 1 or options.timeout <= 0 or options.test_timeout <= 0 or options.memory_gb <= 0:
        parser.error("--jobs, --timeout, --test-timeout and --memory-gb must be positive")
    exercises = [e.strip() for e in options.exercises.split(",") if e.strip()] if options.exercises else None
    # SIGTERM and SIGHUP as Ctrl-C (also where a shell started this in the background, with SIGINT ignored): the
    # running judges are stopped, not left behind.
    stopping.stop_like_ctrl_c()
    started = time.monotonic()
    try:
        results = grade_class(options.submissions, options.out, GradeOptions(
            jobs=options.jobs, timeout=options.timeout, test_timeout=options.test_timeout, hidden=options.tests,
            exercises=exercises, memory_gb=options.memory_gb, address_space_gb=options.address_space_gb,
            max_processes=options.max_processes, gpu_memory_fraction=options.gpu_memory_fraction,
            isolation=options.isolation, allow_weak_isolation=options.allow_weak_isolation,
            memory_limiter=options.memory_limiter,
            calibrate=not options.no_calibration, time_factor=options.time_factor, time_floor=options.time_floor,
            use_cache=not options.recalibrate, progress=not options.no_progress))
    except KeyboardInterrupt:
        print("interrupted: every running judge was stopped; grades.csv was not written", file=sys.stderr)
        return 130
    counts = {status: sum(r.status == status for r in results) for status in STATUSES}
    print(f"graded {len(results)} students in {time.monotonic() - started:.1f} s: "
          + ", ".join(f"{n} {status}" for status, n in counts.items() if n)
          + f"\ngradebook: {options.out / 'grades.csv'}; the class at a glance: {options.out / 'summary.md'}")
    for r in results:
        if r.status != "ok":
            print(f"  {r.student}: {r.status}: {r.detail.splitlines()[0] if r.detail else ''}")
    for r in results:
        if r.outside:
            print(f"  {r.student}: FLAGGED ({r.isolation}): its code opened {len(r.outside)} file(s) outside what it may "
                  f"read, or ran programs, e.g. {r.outside[0]} (all in summary.md)")
    return 1 if counts["grader error"] else 0


if __name__ == "__main__":
    sys.exit(main())
