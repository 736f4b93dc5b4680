"""A time limit per test, from the reference solutions' own time: an infinite loop or a hung collective costs seconds.

Before the class, the reference solutions are graded once by the same sandboxed judge (or the result is
taken from a cache keyed by the tests, the solutions, the course library, the versions and the sandbox),
and must get full marks. Each test's limit is then `factor` times its reference duration, at least `floor`
seconds and at most the instructor's --test-timeout. The judge applies them as pytest-timeout markers.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from course_lib.grading import time_rule
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

    def summary(self) -> str:
        shown = ", ".join(f"{nodeid.split('::')[-1]} {seconds:g} s" for nodeid, seconds in self.limits.items())
        where = f"cached in {self.cache}" if self.cached else f"graded now in {self.reference_seconds:.0f} s"
        return f"time limits per test ({self.note()}; reference {where}): {shown}"

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))




def cache_key(s: Settings) -> str:
    """A hash of the judge's tests, the solutions, the course library, the versions and the kind of sandbox."""
    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = "?"
    profile = os.environ.get("COURSE_HYPOTHESIS", "")  # how many examples each property test draws: its time
    digest = hashlib.sha256(f"{torch} {sys.version} {s.isolation.mode} {profile} {' '.join(s.judge.tests)}".encode())
    for folder in (s.judge.folder / "tests", SOLUTIONS, ROOT / "course_lib"):
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" not in path.parts and "wrong_answers" not in path.parts:
                digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


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


def calibrate(s: Settings, uid: int | None, factor: float = 4.0, floor: float = 5.0, jobs: int = 1,
              use_cache: bool = True) -> TimeLimits:
    """Grade the reference solutions (or read the cache); the time limit of each test, written for the judges.

    The reference runs alone while the students run `jobs` at a time: with more jobs than cores the factor
    grows in proportion.
    """
    cache = CACHE / f"reference-{cache_key(s)}.json"
    cached = use_cache and cache.exists()
    if cached:
        reference = json.loads(cache.read_text())
    else:
        reference = _grade_reference(s, uid)
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(reference, indent=1))
        except OSError:
            pass  # no cache: the next run grades the reference again
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    factor = round(factor * max(1.0, jobs / cores), 2)
    limits = calibrated_limits(reference["durations"], factor, floor, s.test_timeout)
    result = TimeLimits(limits, factor, floor, s.test_timeout, reference["durations"], reference["seconds"],
                        reference["memory_peak_bytes"], str(cache), cached)
    s.time_limits = s.work / "time-limits.json"
    result.after_a_loop = time_rule.limits_after_a_loop(reference["durations"], factor, s.test_timeout)
    s.time_limits.write_text(json.dumps({**limits, time_rule.AFTER_A_LOOP: result.after_a_loop}))
    os.chmod(s.time_limits, 0o644)
    s.limit_note = result.note()
    return result
