"""Mutation score of the graded tests: small changes to a reference solution that the tests should notice (issue 20).

A *mutant* is the reference solution `solutions/exNN_*.py` with one small change inside a
`# BEGIN SOLUTION ... # END SOLUTION` block (what a learner writes): a flipped comparison, an off-by-one
constant, swapped arguments, a dropped statement... Each mutant is written as a complete exNN file into a
folder of its own and graded like a learner's file, `pytest tests/test_exNN_*.py --target FOLDER -x` (the
tests named after the mutated function first, so that a failure comes early). A
mutant is *killed* when a graded test fails, *timed out* when its run passed `--timeout` (its worker is
killed: a hang is a failure the tests saw, so it counts as killed, and the table says how many), and
*survives* when every graded test passes. A survivor is either a hole in the tests (write a test, or a
wrong answer in solutions/wrong_answers/) or an equivalent mutant (the same behaviour written another
way, e.g. `range(0, n)` -> `range(-1 + 1, n)`): read each one.

    python -m course_lib.instructor.selfcheck mutants [ex00 ...] [--jobs N] [--limit N] [--operator NAME]
                                                      [--timeout S] [--list]

Why an AST mutator of our own rather than mutmut or cosmic-ray: those tools run the tests in-process
against the code they mutate in place (or through an import hook), whereas a graded test reaches the
learner's file only in a child process, from the folder given by `--target`. Writing each mutant as a
file and grading the folder fits that path exactly, and reuses the wrong-answer check's workers
(`worker_pool.run_in_workers`: torch and the fork server start once per worker, pytest runs
in-process for one mutant after another, under the Hypothesis profile without shrinking). The mutants
themselves are made by the AST mutator in mutator.py; this module grades them and writes the report.

It is a report: it exits 0 whatever survives, and 1 only when no mutant could be made (or graded).
"""

from __future__ import annotations

import argparse
import ast
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.grading.results import read_report
from course_lib.instructor.mutator import OPERATORS, Mutant, mutate, solution_blocks
from course_lib.instructor.worker_pool import GradingJob, default_jobs, run_in_workers, solution_of, tests_of
from course_lib.paths import ROOT

__all__ = ["OPERATORS", "Mutant", "Outcome", "solution_blocks", "mutate", "mutants_of", "grade", "main"]


@dataclass
class Outcome:
    """What grading one mutant gave: killed, survived, timed out, or error (no report: it could not be graded)."""

    mutant: Mutant
    status: str
    seconds: float | None = None
    failed: list[str] = field(default_factory=list)  # the graded tests that failed (the first one, with -x)
    reason: str = ""


def mutants_of(exercise: str, root: Path = ROOT, operators: list[str] | None = None,
               limit: int | None = None) -> tuple[list[Mutant], Counter]:
    """The exercise's mutants, only those of `operators` if given, then at most `limit` of them (a fixed sample)."""
    solution = solution_of(root, exercise)
    if solution is None:
        raise FileNotFoundError(f"no solutions/{exercise}_*.py under {root}")
    made, skipped = mutate(solution.read_text(), exercise)
    if operators:
        made = [m for m in made if m.operator in operators]
    if limit is not None and len(made) > limit:
        picked = sorted(random.Random(f"mutants-{exercise}").sample(range(len(made)), limit))
        made = [made[i] for i in picked]
    return made, skipped


def _test_order(tests: Path, root: Path, function: str) -> list[str]:
    """The test file's test functions as node ids, those named after `function` first: with -x, a mutant of
    device_for_rank is then killed by test_device_for_rank_... without waiting for every test before it."""
    names = [node.name for node in ast.parse(tests.read_text()).body
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")]
    key = function.split(".")[0].lower().replace("_", "")
    first = [n for n in names if key and key in n.lower().replace("_", "")]
    file = tests.relative_to(root).as_posix()
    return [f"{file}::{name}" for name in first + [n for n in names if n not in first]] or [file]


def _outcome(mutant: Mutant, report_path: Path, result) -> Outcome:
    if result.timed_out:
        return Outcome(mutant, "timed out", result.seconds, reason="ran past the time limit: its worker was killed")
    report = read_report(report_path) if report_path.exists() else None
    if result.seconds is None or report is None:
        tail = result.log_tail()
        return Outcome(mutant, "error", result.seconds, reason="pytest wrote no report" + (": " + tail if tail else ""))
    graded = [t for t in report.tests.values() if t.graded]
    failed = [t.nodeid.split("::", 1)[-1] for t in graded if t.outcome == "failed"]
    if failed:
        return Outcome(mutant, "killed", result.seconds, failed)
    if not graded:
        return Outcome(mutant, "error", result.seconds, reason="no graded test ran")
    return Outcome(mutant, "survived", result.seconds)


def grade(mutants: list[Mutant], root: Path = ROOT, jobs: int = 2, timeout: float = 180,
          python: str = sys.executable, progress: bool = True) -> list[Outcome]:
    """Grade each mutant, the only file of a target folder, on its exercise's tests up to the first failure."""
    if not mutants:
        return []
    with tempfile.TemporaryDirectory(prefix="course-mutants-") as scratch_name:
        scratch = Path(scratch_name)
        grading, reports = [], []
        for mutant in mutants:
            solution, tests = solution_of(root, mutant.exercise), tests_of(root, mutant.exercise)
            if solution is None or tests is None:
                raise FileNotFoundError(f"no solutions/{mutant.exercise}_*.py or tests/test_{mutant.exercise}_*.py")
            folder = scratch / f"{mutant.exercise}-{mutant.number:04d}"
            (folder / "target").mkdir(parents=True)
            (folder / "target" / solution.name).write_text(mutant.source)
            reports.append(folder / "report.jsonl")
            grading.append(GradingJob([*_test_order(tests, root, mutant.function), "--target", str(folder / "target"),
                                       "-x"], reports[-1]))
        outcomes: dict[int, Outcome] = {}

        def done(index: int, result) -> None:
            outcomes[index] = _outcome(mutants[index], reports[index], result)
            if progress:
                o = outcomes[index]
                print(f"  {o.mutant.name} {o.mutant.operator} line {o.mutant.line}: {o.status}"
                      + (f" ({o.seconds:.0f} s)" if o.seconds is not None else ""), flush=True)

        total = timeout * len(mutants) / max(1, jobs) + 120
        results = run_in_workers(grading, root, scratch / "workers", jobs, python, job_timeout=timeout,
                                 timeout=total, on_done=done)
        return [outcomes.get(i) or _outcome(mutants[i], reports[i], r) for i, r in enumerate(results)]


def _table(rows: list[tuple]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _score(outcomes: list[Outcome]) -> str:
    counted = [o for o in outcomes if o.status != "error"]
    caught = sum(o.status in ("killed", "timed out") for o in counted)
    return f"{100 * caught / len(counted):.0f} %" if counted else "-"


def _summary_row(label: str, outcomes: list[Outcome], seconds: float | None = None) -> tuple:
    count = Counter(o.status for o in outcomes)
    row = (label, len(outcomes), count["killed"], count["survived"], count["timed out"], count["error"],
           _score(outcomes))
    return row + ((f"{seconds:.0f}",) if seconds is not None else ())


def _print_report(summary: list[tuple], by_operator: dict[str, list[Outcome]], survivors: list[Outcome],
                  timeout: float) -> None:
    """The tables by exercise and by operator, the score's rule, and each mutant not killed with its diff."""
    header = ("exercise", "mutants", "killed", "survived", "timed out", "error", "score", "seconds")
    print("\n" + _table([header, *summary]))
    print("\n" + _table([("operator",) + header[1:-1], *[_summary_row(k, v) for k, v in sorted(by_operator.items())]]))
    print("\nscore = (killed + timed out) / (mutants - error); a timed-out mutant hung or crawled, which the "
          f"tests saw (--timeout {timeout:g} s)")
    for o in survivors:
        m = o.mutant
        label = {"survived": "SURVIVED", "timed out": "TIMED OUT", "error": "ERROR"}[o.status]
        print(f"\n{label} {m.name} {m.operator} in {m.function}, line {m.line}"
              + (f": {o.reason}" if o.reason else ""))
        print("\n".join("    " + line for line in m.diff().splitlines()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.instructor.selfcheck mutants", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exercises", nargs="*", help="e.g. ex00 (default: every exercise in solutions/)")
    parser.add_argument("--jobs", type=int, default=None, help="mutants graded at once (worker processes)")
    parser.add_argument("--limit", type=int, default=None, help="at most N mutants per exercise, a fixed sample")
    parser.add_argument("--operator", action="append", choices=sorted(OPERATORS),
                        help="only this kind of mutant (may be given more than once)")
    parser.add_argument("--timeout", type=float, default=180,
                        help="seconds one mutant's tests may take before it counts as timed out (killed)")
    parser.add_argument("--list", action="store_true", help="print the mutants without grading them")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    root = options.root.resolve()
    if not (root / "solutions").is_dir():
        print("no solutions/ here (a student release): nothing to mutate")
        return 0
    exercises = options.exercises or sorted({p.name.split("_", 1)[0] for p in (root / "solutions").glob("ex*_*.py")})
    jobs = options.jobs or default_jobs()
    summary, by_operator, survivors, made_any = [], {}, [], False
    for exercise in exercises:
        try:
            mutants, skipped = mutants_of(exercise, root, options.operator, options.limit)
        except (FileNotFoundError, SyntaxError) as error:
            print(f"{exercise}: {error}")
            continue
        made_any |= bool(mutants)
        kinds = Counter(m.operator for m in mutants)
        print(f"{exercise}: {len(mutants)} mutants ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})"
              + (f"; not made: {sum(skipped.values())} ({', '.join(f'{k} {n}' for k, n in sorted(skipped.items()))})"
                 if skipped else ""), flush=True)
        if options.list:
            for m in mutants:
                print(f"{m.name}  {m.operator}  {m.function}, line {m.line}\n"
                      + "\n".join("    " + line for line in m.diff().splitlines()))
            continue
        if tests_of(root, exercise) is None:
            print(f"{exercise}: no tests/test_{exercise}_*.py")
            continue
        started = time.monotonic()
        outcomes = grade(mutants, root, jobs, options.timeout)
        seconds = time.monotonic() - started
        summary.append(_summary_row(exercise, outcomes, seconds))
        for o in outcomes:
            by_operator.setdefault(o.mutant.operator, []).append(o)
        survivors += [o for o in outcomes if o.status in ("survived", "error", "timed out")]
    if not made_any:
        print("no mutant could be made")
        return 1
    if options.list or not summary:
        return 0
    _print_report(summary, by_operator, survivors, options.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
