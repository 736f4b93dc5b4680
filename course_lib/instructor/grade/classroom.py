"""Grading a whole class: every submission, a few at a time, one row each, whatever any of them does."""

from __future__ import annotations

import os
import queue
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from course_lib.grading import time_rule
from course_lib.instructor.grade.judge import build_judge, collect_expected, judge_env
from course_lib.instructor.grade.judge_zygote import JudgeZygote
from course_lib.instructor.grade.report import Result, write_gradebook, write_summary
from course_lib.instructor.grade.sandbox import (Isolation, default_rlimit_as_gb, detect_isolation, gpu_present,
                                                refuse_weak_isolation)
from course_lib.instructor.grade.student import Settings, grade_one, stop_all
from course_lib.instructor.grade.submissions import find_submissions
from course_lib.instructor.grade.time_limits import calibrate
from course_lib.instructor.grade.users import UidClaim
from course_lib.paths import SOLUTIONS

GiB = 2**30


@dataclass
class GradeOptions:
    """How a class is graded (the command line's options; see cli.py for what each means)."""

    jobs: int = 1
    timeout: float = 900.0  # seconds for one student's whole run
    test_timeout: float = 120.0  # a test's limit when not calibrated, and the most any calibrated limit may be
    hidden: Path | None = None
    exercises: list[str] | None = None
    memory_gb: float = 4.0  # all of one student's processes together
    address_space_gb: float | None = None  # each process; None: 6, or none on a CUDA machine
    max_processes: int = 256
    gpu_memory_fraction: float | None = None  # of each GPU per process; None: 0.9 / jobs where there are GPUs
    isolation: str = "auto"  # auto, bwrap, unshare or none
    allow_weak_isolation: bool = False  # grade without bubblewrap (unshare or none); refused otherwise
    memory_limiter: str = "auto"  # auto, cgroup or watchdog
    calibrate: bool = True
    time_factor: float = 4.0
    time_floor: float = time_rule.FLOOR
    use_cache: bool = True
    progress: bool = True


def prepare_settings(out: Path, work: Path, submissions: Path, o: GradeOptions, isolation: Isolation) -> Settings:
    """What every student's grading shares: the judge (its tests collected once), the bounds, what to hide; said on
    stderr. The class grader and the Gradescope package (gradescope/) both start here."""
    rlimit_gb = default_rlimit_as_gb() if o.address_space_gb is None else o.address_space_gb
    gpu_fraction = (round(0.9 / o.jobs, 3) if gpu_present() else 0.0) if o.gpu_memory_fraction is None \
        else o.gpu_memory_fraction
    bounds = [f"memory: {o.memory_gb:g} GiB for all of a student's processes together ({isolation.memory})",
              f"address space: {f'{rlimit_gb:g} GiB per process' if rlimit_gb else 'no limit per process'}"]
    if not rlimit_gb:
        isolation.problems.append("no address-space limit per process (a CUDA machine, or --address-space-gb 0): "
                                  "a single huge allocation is stopped by the memory limit above, more slowly")
    if gpu_fraction:
        bounds.append(f"GPU memory: PyTorch's allocator capped at {gpu_fraction:g} of each GPU per process "
                      "(advisory: code that allocates outside PyTorch is not bounded)")
    if isolation.users:
        bounds.append(f"processes: {o.max_processes} per student")
    print(isolation.describe() + "\nbounds: " + "; ".join(bounds), file=sys.stderr, flush=True)
    judge = build_judge(work, o.hidden, o.exercises)
    if not judge.tests:
        raise SystemExit("error: no graded test files to run" + (f" for {', '.join(o.exercises)}" if o.exercises else ""))
    judge.expected = collect_expected(judge, work, o.test_timeout)
    return Settings(out=out, work=work, judge=judge, isolation=isolation, timeout=o.timeout,
                    test_timeout=o.test_timeout, memory_bytes=int(o.memory_gb * GiB),
                    rlimit_as_bytes=int(rlimit_gb * GiB), max_processes=o.max_processes,
                    gpu_memory_fraction=gpu_fraction, hide=[SOLUTIONS, submissions, out, *([o.hidden] if o.hidden else [])])


def grade_class(submissions: Path, out: Path, options: GradeOptions | None = None) -> list[Result]:
    """Grade every submission in `submissions`; write the gradebook and feedback to `out`; return the results."""
    o = options or GradeOptions()
    submissions, out = submissions.resolve(), out.resolve()
    o.hidden = o.hidden.resolve() if o.hidden else None
    isolation = detect_isolation(o.isolation, o.memory_limiter)
    if isolation.mode != "bwrap" and not o.allow_weak_isolation:
        raise SystemExit(refuse_weak_isolation(isolation, o.isolation))
    entries = [(name, path) for name, path in find_submissions(submissions) if path.resolve() != out]
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="course-grade-"))
    os.chmod(work, 0o711)
    claim = zygote = None
    try:
        # Judges forked from one process that imported torch once, started now so that its imports overlap the
        # tests' collection below (judge_zygote.py); not where another program wraps each judge (unshare).
        zygote = JudgeZygote(judge_env(work, isolation.mode == "bwrap")) if isolation.mode != "unshare" else None
        s = prepare_settings(out, work, submissions, o, isolation)
        s.zygote = zygote
        claim = UidClaim(o.jobs) if s.isolation.users else None
        uids = claim.uids if claim is not None else [None] * o.jobs
        if claim is not None:
            print(f"students' code runs as users {', '.join(map(str, uids))}", file=sys.stderr, flush=True)
        if o.calibrate and SOLUTIONS.is_dir():
            limits = calibrate(s, uids[0], o.time_factor, o.time_floor, o.jobs, o.use_cache)
            limits.write(out / "time_limits.json")
            print(limits.summary(out / "time_limits.json"), file=sys.stderr, flush=True)
            if limits.reference_memory_peak_bytes > s.memory_bytes / 2:
                print(f"WARNING: the reference solutions used {limits.reference_memory_peak_bytes / GiB:.1f} GiB of "
                      f"memory, more than half of --memory-gb {o.memory_gb:g}: honest students may hit it",
                      file=sys.stderr, flush=True)
        else:
            print(f"time limit per test: {o.test_timeout:g} s" + ("" if o.calibrate else " (--no-calibration)")
                  + ("" if SOLUTIONS.is_dir() else " (no solutions/ here to calibrate from)"), file=sys.stderr)
        possible = sum(t.possible for t in s.judge.expected)
        print(f"grading {len(entries)} submissions from {submissions}: {len(s.judge.expected)} graded tests, "
              f"{possible:g} points possible, {o.jobs} at a time, at most {o.timeout:g} s each", file=sys.stderr,
              flush=True)
        results = _grade_all(entries, s, uids, o.progress)
        write_gradebook(results, s.judge.expected, out / "grades.csv")
        write_summary(results, s.judge.expected, out)
        return sorted(results, key=lambda r: r.student.lower())
    finally:
        if zygote is not None:
            zygote.close()
        if claim is not None:
            claim.release()
        shutil.rmtree(work, ignore_errors=True)


def _grade_all(entries: list[tuple[str, Path]], s: Settings, uids: list[int | None], progress: bool) -> list[Result]:
    free: queue.Queue = queue.Queue()
    for uid in uids:
        free.put(uid)

    def task(index: int, name: str, entry: Path) -> Result:
        uid = free.get()
        try:
            return grade_one(name, entry, index, uid, s)
        except Exception as error:  # noqa: BLE001 - a bug here must cost one row, never the class
            return Result(name, "grader error", f"{type(error).__name__}: {error}", [], 0.0,
                          isolation=s.isolation.mode)
        finally:
            free.put(uid)

    results: list[Result] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(entries), unit="student", file=sys.stderr, dynamic_ncols=True)
    pool, futures = ThreadPoolExecutor(max_workers=len(uids)), []
    try:
        futures = [pool.submit(task, i, name, entry) for i, (name, entry) in enumerate(entries, 1)]
        for future in as_completed(futures):
            result = future.result()
            results.append(result)
            if bar is not None:
                bar.set_postfix_str(f"{result.student}: {result.status}", refresh=False)
                bar.update(1)
    except BaseException:  # Ctrl-C: stop every judge now rather than at its time limit
        for future in futures:
            future.cancel()
        stop_all()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar.close()
    return results
