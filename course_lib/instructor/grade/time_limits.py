"""A time limit per test, from the reference solutions' own time: an infinite loop or a hung collective costs seconds.

Before the class, the reference solutions are graded once by the same sandboxed judge (or the result is
taken from a cache, test file by test file, keyed by the file, its exercise's solution, the course library, the
versions and the sandbox: graders of different exercises on one machine share the files they have in common),
and must get full marks. Each test's limit is then `factor` times its reference duration, at least `floor`
seconds and at most the instructor's --test-timeout. The judge applies them as pytest-timeout markers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from course_lib.grading import time_rule
from course_lib.grading.results import exercise_of
from course_lib.grading.time_rule import calibrated_limits  # noqa: F401 (the rule, shared with check)
from course_lib.instructor.grade.student import Settings, run_judge
from course_lib.paths import ROOT, SOLUTIONS

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "multigpu-course" / "grade"


@dataclass
class TimeLimits:
    """The limit of each graded test, and how it was set (written to OUT/time_limits.json)."""

    limits: dict[str, float]
    factor: float
    floor: float
    ceiling: float
    reference_durations: dict[str, float] = field(default_factory=dict)
    reference_seconds: float = 0.0  # the reference's whole judge run
    reference_memory_peak_bytes: int = 0
    cache: str = ""
    cached: bool = False
    after_a_loop: dict[str, float] = field(default_factory=dict)  # once a test of the exercise ran out of time

    def note(self) -> str:
        """One line for the students' feedback."""
        return (f"each test's time limit is {self.factor:g} × the reference solution's time, at least "
                f"{self.floor:g} s and at most {self.ceiling:g} s")

    def how(self, nodeid: str) -> str:
        """How the rule (time_rule.calibrated_limits) gave this test its limit: '4 × 1.21 s, the reference's time',
        'the floor (4 × 0.41 s is less)' or 'the ceiling (4 × 40 s is more)'."""
        seconds = self.reference_durations.get(nodeid)
        if seconds is None:
            return "no reference time"
        scaled = f"{self.factor:g} × {seconds:.3g} s"
        if max(self.floor, self.factor * seconds) >= self.ceiling:
            return f"the ceiling ({scaled} is more)" if self.factor * seconds >= self.ceiling else "the ceiling"
        if self.factor * seconds <= self.floor:
            return f"the floor ({scaled} is less)"
        return f"{scaled}, the reference's time"

    def table(self) -> list[dict]:
        """One row per test: its reference time, its limit, how the rule gave it, and its limit once a test of the
        same exercise has run out of time."""
        return [{"test": nodeid, "reference_seconds": self.reference_durations.get(nodeid), "limit_seconds": seconds,
                 "how": self.how(nodeid), "limit_after_a_loop_seconds": self.after_a_loop.get(nodeid)}
                for nodeid, seconds in self.limits.items()]

    def summary(self, table: Path | str) -> str:
        """One line for the instructor: how many tests, the range of their limits, the rule, where the table is."""
        seconds = sorted(self.limits.values())
        shown = f"{seconds[0]:g}–{seconds[-1]:g} s" if seconds else "none"
        at_floor = sum(1 for nodeid in self.limits if self.how(nodeid).startswith("the floor"))
        where = "cached" if self.cached else f"measured now in {self.reference_seconds:.0f} s"
        return (f"[grade] time limits: {len(self.limits)} tests, {shown} ({self.factor:g} × the reference solution's "
                f"time, at least {self.floor:g} s, at most {self.ceiling:g} s: {at_floor} at the floor; reference "
                f"times {where}); each test's in {table}")

    def write(self, path: Path) -> None:
        """The limits as a table (tests: one row per test) beside what they were set from."""
        path.write_text(json.dumps({"rule": self.note(), "tests": self.table(), **asdict(self)}, indent=1,
                                   ensure_ascii=False) + "\n", encoding="utf-8")


@functools.lru_cache(maxsize=None)
def _library_digest(folder: Path) -> bytes:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.digest()


def cache_key(s: Settings, test: str) -> str:
    """A hash of one of the judge's test files and what its reference time depends on: its exercise's solution,
    the conftest files above it, the course library, the versions, the kind of sandbox, the Hypothesis profile."""
    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = "?"
    profile = os.environ.get("COURSE_HYPOTHESIS", "")  # how many examples each property test draws: its time
    digest = hashlib.sha256(f"{torch} {sys.version} {s.isolation.mode} {profile} {test}".encode())
    path = s.judge.folder / test
    digest.update(path.read_bytes() + b"\0")
    for folder in path.parents:  # the conftest.py files pytest loads for this file, up to the judge's folder
        if (folder / "conftest.py").is_file():
            digest.update(b"conftest\0" + (folder / "conftest.py").read_bytes() + b"\0")
        if folder == s.judge.folder:
            break
    for solution in sorted(SOLUTIONS.glob(f"{exercise_of(test)}_*.py")):
        digest.update(solution.name.encode() + b"\0" + solution.read_bytes() + b"\0")
    digest.update(_library_digest(ROOT / "course_lib"))
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _calibration_lock():
    """One calibration at a time on this machine: a second grader waits, then finds the first one's files cached
    (the course's own tests build a Gradescope package while they grade a class: ex00 is calibrated once)."""
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        handle = open(CACHE / "calibrating.lock", "a+")  # noqa: SIM115 - closed below
    except OSError:  # no cache folder: nothing to share
        yield
        return
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("[grade] another grader is calibrating the reference solutions on this machine: waiting for it, "
                  "to share its times", file=sys.stderr, flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        handle.close()


def _read_cached(path: Path) -> dict | None:
    try:
        entry = json.loads(path.read_text())
        return entry if isinstance(entry.get("durations"), dict) else None
    except (OSError, ValueError, AttributeError):
        return None


def _reference(s: Settings, uid: int | None, use_cache: bool) -> tuple[dict, bool]:
    """The reference solutions' durations for every test file of the judge, and whether all came from the cache.

    Cached file by file (cache_key), so that graders of different exercises share the ones they have in common;
    the files not cached are graded now, in one judge run, and cached.
    """
    with _calibration_lock():
        paths = {test: CACHE / f"reference-{cache_key(s, test)}.json" for test in s.judge.tests}
        found = {test: _read_cached(path) if use_cache else None for test, path in paths.items()}
        missing = [test for test, entry in found.items() if entry is None]
        if missing:
            ran = _grade_reference(dataclasses.replace(s, judge=dataclasses.replace(s.judge, tests=missing)), uid)
            total = sum(ran["durations"].values()) or 1.0
            for test in missing:
                durations = {n: d for n, d in ran["durations"].items() if n.split("::")[0] == test}
                # the judge's whole run, shared among its files by their tests' time
                found[test] = {"durations": durations, "seconds": ran["seconds"] * sum(durations.values()) / total,
                               "memory_peak_bytes": ran["memory_peak_bytes"]}
                try:
                    paths[test].write_text(json.dumps(found[test], indent=1))
                except OSError:
                    pass  # no cache: the next run grades the reference again
    reference = {"durations": {n: d for entry in found.values() for n, d in entry["durations"].items()},
                 "seconds": sum(entry["seconds"] for entry in found.values()),
                 "memory_peak_bytes": max((entry["memory_peak_bytes"] for entry in found.values()), default=0)}
    return reference, not missing


def _grade_reference(s: Settings, uid: int | None) -> dict:
    files = {p.name: p.read_bytes() for p in sorted(SOLUTIONS.glob("ex[0-9][0-9]_*.py"))}
    run = run_judge("reference", files, 0, uid, s)
    tests = run.report.tests if run.report is not None else {}
    graded = [t for t in tests.values() if t.points is not None]
    failed = [t.nodeid for t in graded if t.outcome not in ("passed", "skipped")]
    if run.returncode not in (0, 1) or failed or not graded:
        log = run.log.read_text(errors="replace")[-3000:] if run.log.exists() else ""
        raise SystemExit(f"error: the reference solutions do not pass the judge here, so no time limit can be "
                         f"calibrated (failed: {failed or 'the judge itself'}); its log ends with:\n{log}")
    run.log.unlink(missing_ok=True)
    return {"durations": {t.nodeid: t.duration for t in graded if t.outcome == "passed"},
            "seconds": run.seconds, "memory_peak_bytes": run.memory_peak_bytes}


def contention(jobs: int, cores: int | None = None) -> float:
    """How much slower a test runs with `jobs` judges at a time than the reference did alone.

    A judge's test keeps about two cores busy (most graded tests launch two or three ranks, which the reference ran
    on every core), so judges share the machine once jobs × 2 exceeds the cores: on 2 cores `--jobs 2` is 2 (a
    correct student's 3-rank test of ex05 took over 4 × its reference time beside another judge, and lost its
    points, with the factor 4 this gave before), on 4 cores 1, on 16 cores `--jobs 8` 1, on one core `--jobs` itself.
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cores = max(cores, 1)
    return max(1.0, jobs * min(2, cores) / cores)


def calibrate(s: Settings, uid: int | None, factor: float = 4.0, floor: float = 5.0, jobs: int = 1,
              use_cache: bool = True) -> TimeLimits:
    """Grade the reference solutions (or read the cache); the time limit of each test, written for the judges.

    The reference runs alone while the students run `jobs` at a time: the factor grows by `contention(jobs)`.
    """
    reference, cached = _reference(s, uid, use_cache)
    cache = CACHE
    factor = round(factor * contention(jobs), 2)
    limits = calibrated_limits(reference["durations"], factor, floor, s.test_timeout)
    result = TimeLimits(limits, factor, floor, s.test_timeout, reference["durations"], reference["seconds"],
                        reference["memory_peak_bytes"], str(cache), cached)
    s.time_limits = s.work / "time-limits.json"
    result.after_a_loop = time_rule.limits_after_a_loop(reference["durations"], factor, s.test_timeout)
    s.time_limits.write_text(json.dumps({**limits, time_rule.AFTER_A_LOOP: result.after_a_loop}))
    os.chmod(s.time_limits, 0o644)
    s.limit_note = result.note()
    return result
