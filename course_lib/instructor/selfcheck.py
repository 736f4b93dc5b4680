"""The course checking its own graded tests (`python3 course.py test` runs it before the suite).

    python -m course_lib.instructor.selfcheck stubs                  every graded test must fail on the stubs
    python -m course_lib.instructor.selfcheck wrong-answers [exNN]   every wrong answer must lose points
    python -m course_lib.instructor.selfcheck mutants [exNN]         which small changes to a solution the tests miss

A graded test that passes on a stub grades nothing; one that a plausible mistake passes grades too little
(the wrong answers are in solutions/wrong_answers/, see course_lib/instructor/wrong_answers.py).
The mutation score (course_lib/instructor/mutants.py) is a report for instructors, not a pass/fail check:
it is slow (minutes per exercise), and a surviving mutant may be an equivalent program.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from course_lib import stopping
from course_lib.grading.results import read_report
from course_lib.instructor.exercises import expected_stubs
from course_lib.paths import ROOT, SOLUTIONS


def say(message: str) -> None:
    print(f"[course] {message}", flush=True)


def _pytest(args: list[str], report: Path) -> int:
    """Run pytest under the Hypothesis profile without shrinking (a stub fails every example: no shrink teaches)."""
    from course_lib.instructor.wrong_answers import WORKER_ENVIRONMENT

    command = [sys.executable, "-m", "pytest", *args, "--course-report", str(report), "-q", "-p", "no:cacheprovider"]
    return subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          env={**os.environ, **WORKER_ENVIRONMENT, **stopping.dies_with_me()}).returncode


def stubs_fail(exercises: list[str] | None = None) -> bool:
    """Grade freshly made stubs (never the learner's exercises/) and require every graded test to fail: of every
    exercise, or of those named (["ex05"])."""
    tests = ["tests"]
    if exercises:
        tests = [str(p.relative_to(ROOT)) for ex in exercises for p in sorted((ROOT / "tests").glob(f"test_{ex}_*.py"))]
        unknown = [ex for ex in exercises if not list((ROOT / "tests").glob(f"test_{ex}_*.py"))]
        if unknown:
            say(f"FAILED: no graded tests for {', '.join(unknown)} (tests/test_exNN_*.py)")
            return False
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "stubs"
        folder.mkdir()
        for name, text in expected_stubs(SOLUTIONS).items():
            (folder / name).write_text(text)
        _pytest([*tests, "-m", "points", "--target", "solutions", "--collect-only"], Path(tmp) / "collected.jsonl")
        collected = read_report(Path(tmp) / "collected.jsonl")
        if collected is not None and collected.collected is not None:
            say(f"{len(collected.collected)} graded tests, run once against the stubs (about 2 minutes on 2 cores)")
        _pytest([*tests, "-m", "points", "--target", str(folder)], Path(tmp) / "stubs.jsonl")
        ran = read_report(Path(tmp) / "stubs.jsonl")
    if ran is None or collected is None or collected.collected is None:
        say("FAILED: pytest wrote no report for the stub run")
        return False
    tests = ran.graded()
    expected = [t for t in collected.collected if t.points is not None]
    counts = {kind: [t.nodeid for t in tests if t.outcome == kind] for kind in ("passed", "failed", "skipped")}
    say(f"graded tests on the stubs: {len(counts['failed'])} failed, {len(counts['passed'])} passed, "
        f"{len(counts['skipped'])} skipped (of {len(expected)} collected)")
    ok = True
    if counts["passed"]:
        ok = False
        say("FAILED: these graded tests pass on the untouched stubs, so they grade nothing:")
        for nodeid in counts["passed"]:
            print(f"    {nodeid}")
    if len(tests) != len(expected) or not expected:
        ok = False
        say(f"FAILED: {len(tests)} graded tests ran on the stubs but {len(expected)} were collected")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.instructor.selfcheck", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=["stubs", "wrong-answers", "mutants"])
    options, rest = parser.parse_known_args(argv)
    if options.check == "wrong-answers":
        from course_lib.instructor import wrong_answers

        return wrong_answers.main(rest)
    if options.check == "mutants":
        from course_lib.instructor import mutants

        return mutants.main(rest)
    unknown = [arg for arg in rest if not arg.startswith("ex")]
    if unknown:
        parser.error(f"stubs takes exercise names (ex05), not {' '.join(unknown)}")
    return 0 if stubs_fail(rest) else 1


if __name__ == "__main__":
    stopping.stop_like_ctrl_c()  # SIGTERM too stops the check, with the pytest runs and workers it started
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        say("stopped; the check did not finish")
        sys.exit(130)
