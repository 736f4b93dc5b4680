"""Grading a whole class: every submission, a few at a time, one row each, whatever any of them does."""

from __future__ import annotations

import os
import queue
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from course_lib.instructor.grade.judge import build_judge, collect_expected
from course_lib.instructor.grade.report import Result, write_gradebook
from course_lib.instructor.grade.sandbox import default_memory_gb, detect_sandbox, free_uids
from course_lib.instructor.grade.student import Settings, grade_one, stop_all
from course_lib.instructor.grade.submissions import find_submissions
from course_lib.paths import SOLUTIONS


def grade_class(submissions: Path, out: Path, jobs: int = 1, timeout: float = 900.0, test_timeout: float = 120.0,
                hidden: Path | None = None, exercises: list[str] | None = None, memory_gb: float | None = None,
                max_processes: int = 256, progress: bool = True) -> list[Result]:
    """Grade every submission in `submissions`; write the gradebook and feedback to `out`; return the results."""
    submissions, out = submissions.resolve(), out.resolve()
    hidden = hidden.resolve() if hidden else None
    entries = [(name, path) for name, path in find_submissions(submissions) if path.resolve() != out]
    sandbox = detect_sandbox()
    if memory_gb is None:
        memory_gb = default_memory_gb()
    if not memory_gb:
        sandbox.missing.append("no memory limit for student code (--memory-gb 0; on a CUDA machine that is the "
                               "default, because CUDA reserves more address space than any useful limit)")
    print(sandbox.describe(), file=sys.stderr, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="course-grade-"))
    os.chmod(work, 0o711)
    try:
        judge = build_judge(work, hidden, exercises)
        if not judge.tests:
            raise SystemExit("error: no graded test files to run" + (f" for {', '.join(exercises)}" if exercises else ""))
        judge.expected = collect_expected(judge, work, test_timeout)
        s = Settings(out=out, work=work, judge=judge, sandbox=sandbox, timeout=timeout, test_timeout=test_timeout,
                     memory_bytes=int(memory_gb * 2**30), max_processes=max_processes,
                     hide=[SOLUTIONS, submissions, out, *([hidden] if hidden else [])])
        possible = sum(t.possible for t in judge.expected)
        print(f"grading {len(entries)} submissions from {submissions}: {len(judge.expected)} graded tests, "
              f"{possible:g} points possible, {jobs} at a time, at most {timeout:g} s each", file=sys.stderr, flush=True)
        results = _grade_all(entries, s, jobs, progress)
        write_gradebook(results, judge.expected, out / "grades.csv")
        return sorted(results, key=lambda r: r.student.lower())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _grade_all(entries: list[tuple[str, Path]], s: Settings, jobs: int, progress: bool) -> list[Result]:
    uids: queue.Queue = queue.Queue()
    for uid in (free_uids(jobs) if s.sandbox.users else [None] * jobs):
        uids.put(uid)

    def task(index: int, name: str, entry: Path) -> Result:
        uid = uids.get()
        try:
            return grade_one(name, entry, index, uid, s)
        except Exception as error:  # noqa: BLE001 - a bug here must cost one row, never the class
            return Result(name, "grader error", f"{type(error).__name__}: {error}", [], 0.0)
        finally:
            uids.put(uid)

    results: list[Result] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(entries), unit="student", file=sys.stderr, dynamic_ncols=True)
    pool, futures = ThreadPoolExecutor(max_workers=max(1, jobs)), []
    try:
        futures = [pool.submit(task, i, name, entry) for i, (name, entry) in enumerate(entries)]
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
