"""Check that plausible wrong answers lose points: a graded test that a wrong answer passes grades nothing (issue 12).

A wrong answer is a small file, `solutions/wrong_answers/exNN/<mistake>.py`:

    \"\"\"Sends everything to rank 0, sums there and sends the sum back: right values, but no ring.\"\"\"

    LOSES = ["test_ring_all_reduce_matches_the_sum_along_a_ring"]

    def ring_all_reduce(tensor):
        ...

Its text is appended to the reference solution's, so its `def` (or `class`) replaces the solution's function
(or class) of the same name, and the result is graded like a learner's file: only the tests named in LOSES are
run, and each of them must fail in at least one of its parametrizations, that is lose points. To keep CI short,
a few worker processes each import torch and start the ranks' fork server once and then run pytest
in-process for one wrong answer after another, taken from a queue (`run_in_workers`, in worker_pool.py, which
the mutation check, course_lib/instructor/mutants.py, shares), and a test stops at its first failing
parametrization (so "points lost" is then a lower bound, marked ≥). The workers run under the Hypothesis profile
`selfcheck` (COURSE_HYPOTHESIS, see course_lib/grading/plugin.py): no shrinking, as only a failure counts.

    python -m course_lib.instructor.selfcheck wrong-answers [ex04 ...] [--jobs N]

prints one row per wrong answer and exits 1 naming every wrong answer that lost no points, every LOSES
name that matches no test, and every file that is not a well-formed wrong answer.
"""

from __future__ import annotations

import argparse
import ast
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from course_lib import stopping
from course_lib.grading.results import read_report
from course_lib.instructor.worker_pool import (WORKER_ENVIRONMENT, GradingJob, JobResult, default_jobs,  # noqa: F401
                                               run_in_workers, worker)
from course_lib.instructor.worker_pool import solution_of as _solution_file, tests_of as _test_file
from course_lib.paths import ROOT


__all__ = ["WrongAnswer", "Verdict", "discover", "check", "main", "GradingJob", "JobResult", "run_in_workers"]


@dataclass
class WrongAnswer:
    """One file of a wrong-answer suite (issue 12)."""

    exercise: str  # "ex04"
    path: Path
    mistake: str = ""  # the docstring's one line
    loses: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # why the file is not a well-formed wrong answer

    @property
    def name(self) -> str:
        return self.path.stem


@dataclass
class Verdict:
    """What grading one wrong answer gave: the points it lost on each test it targets."""

    wrong: WrongAnswer
    ok: bool
    lost: dict[str, tuple[float, float]] = field(default_factory=dict)  # test -> (points lost, points possible)
    reason: str = ""
    seconds: float = 0.0
    partial: bool = False  # some parametrizations were skipped once one had failed: "points lost" is a lower bound


def _module_level_functions(source: str) -> set[str]:
    """The functions and classes a file defines at module level: what a wrong answer can redefine (ex02's Prefetcher)."""
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {node.name for node in ast.parse(source).body if isinstance(node, kinds)}


def _read(exercise: str, path: Path) -> WrongAnswer:
    wrong = WrongAnswer(exercise, path)
    try:
        source = path.read_text()
        tree = ast.parse(source)
    except (OSError, SyntaxError, UnicodeDecodeError) as error:
        wrong.problems.append(f"cannot be read or parsed: {error}")
        return wrong
    docstring = ast.get_docstring(tree)
    if not docstring or len(docstring.strip().splitlines()) != 1:
        wrong.problems.append("needs a one-line module docstring saying what the mistake is")
    else:
        wrong.mistake = docstring.strip()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "LOSES" for t in node.targets):
            try:
                wrong.loses = ast.literal_eval(node.value)
            except ValueError:
                wrong.problems.append("LOSES must be a literal list of test names")
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            wrong.problems.append("a __future__ import cannot be appended to the solution; leave it out")
    if not (isinstance(wrong.loses, list) and wrong.loses and all(isinstance(n, str) for n in wrong.loses)):
        wrong.problems.append("LOSES must name at least one graded test, e.g. LOSES = [\"test_shard_range_matches_tensor_split\"]")
        wrong.loses = [n for n in wrong.loses if isinstance(n, str)] if isinstance(wrong.loses, list) else []
    if not _module_level_functions(source):
        wrong.problems.append("redefines no function or class")
    return wrong


def discover(root: Path = ROOT, exercises: list[str] | None = None) -> list[WrongAnswer]:
    """Every wrong answer under root/solutions/wrong_answers/, optionally only those of some exercises."""
    folder = root / "solutions" / "wrong_answers"
    found = []
    for exercise_dir in sorted(p for p in folder.glob("ex*") if p.is_dir()):
        if exercises and exercise_dir.name not in exercises:
            continue
        for path in sorted(exercise_dir.glob("*.py")):
            if not path.name.startswith("_"):
                found.append(_read(exercise_dir.name, path))
    return found


def _graded_names(test_file: Path) -> set[str]:
    return {name for name in _module_level_functions(test_file.read_text()) if name.startswith("test_")}


@dataclass
class _Job:
    """One wrong answer made ready to grade: its target folder, the node ids to run, where the report goes."""

    wrong: WrongAnswer
    target: Path
    nodeids: list[str]
    report: Path


def _prepare(wrong: WrongAnswer, root: Path, scratch: Path) -> _Job | Verdict:
    """The solution with `wrong` appended, in a folder of its own; or a Verdict if it cannot be graded."""
    solution, tests = _solution_file(root, wrong.exercise), _test_file(root, wrong.exercise)
    if wrong.problems:
        return Verdict(wrong, False, reason="; ".join(wrong.problems))
    if solution is None or tests is None:
        return Verdict(wrong, False, reason=f"no solutions/{wrong.exercise}_*.py or tests/test_{wrong.exercise}_*.py")
    unknown = [name for name in wrong.loses if name not in _graded_names(tests)]
    if unknown:
        return Verdict(wrong, False, reason=f"LOSES names no test in {tests.name}: {', '.join(unknown)}")
    solution_text, wrong_text = solution.read_text(), wrong.path.read_text()
    if not _module_level_functions(wrong_text) & _module_level_functions(solution_text):
        return Verdict(wrong, False, reason="redefines no function of the solution, nor a class (check the name)")
    combined = f"{solution_text}\n\n# ---- wrong answer {wrong.exercise}/{wrong.path.name}, appended ----\n{wrong_text}"
    try:
        compile(combined, wrong.path.name, "exec")
    except SyntaxError as error:
        return Verdict(wrong, False, reason=f"the solution with it appended does not compile: {error}")
    folder = scratch / f"{wrong.exercise}-{wrong.name}"
    (folder / "target").mkdir(parents=True)
    (folder / "target" / solution.name).write_text(combined)
    nodeids = [f"{tests.relative_to(root).as_posix()}::{name}" for name in wrong.loses]
    return _Job(wrong, folder / "target", nodeids, folder / "report.jsonl")


def _verdict(job: _Job, seconds: float, worker_log: Path | None = None) -> Verdict:
    """Read a job's report: every test it names must have lost points in at least one parametrization."""
    if not job.report.exists():
        tail = worker_log.read_text(errors="replace").strip().splitlines()[-4:] if worker_log and worker_log.exists() else []
        return Verdict(job.wrong, False, reason="pytest wrote no report" + (": " + " | ".join(tail) if tail else ""),
                       seconds=seconds)
    report = read_report(job.report)
    results = list(report.tests.values()) if report is not None else []
    lost: dict[str, tuple[float, float]] = {}
    partial = False
    for name in job.wrong.loses:
        mine = [t for t in results if t.nodeid.split("::", 1)[-1].split("[", 1)[0] == name]
        partial |= any(t.outcome == "skipped" for t in mine)
        lost[name] = (sum(t.points or 0 for t in mine if t.outcome == "failed"), sum(t.points or 0 for t in mine))
    kept = [name for name, (points, _) in lost.items() if points == 0]
    ran_nothing = [name for name, (_, possible) in lost.items() if possible == 0]
    reason = ""
    if ran_nothing:
        reason = f"no graded test with points ran for {', '.join(ran_nothing)}"
    elif kept:
        reason = f"lost no points on {', '.join(kept)}"
    return Verdict(job.wrong, not reason, lost, reason, seconds, partial)


def check(wrongs: list[WrongAnswer], root: Path = ROOT, jobs: int = 2, python: str = sys.executable,
          progress: bool = True, timeout: float = 1800) -> list[Verdict]:
    """Grade every wrong answer in `jobs` worker processes; return the verdicts in the order given."""
    verdicts: dict[int, Verdict] = {}
    with tempfile.TemporaryDirectory(prefix="course-wrong-answers-") as scratch_name:
        scratch = Path(scratch_name)
        ready: list[tuple[int, _Job]] = []
        for index, wrong in enumerate(wrongs):
            prepared = _prepare(wrong, root, scratch)
            if isinstance(prepared, Verdict):
                verdicts[index] = prepared
            else:
                ready.append((index, prepared))

        def done(position: int, result: JobResult) -> None:
            index, job = ready[position]
            if result.seconds is not None:
                verdicts[index] = _verdict(job, result.seconds, result.log)
            else:
                tail = result.log_tail()
                verdicts[index] = Verdict(job.wrong, False, reason="not graded: its worker stopped or ran out of time"
                                          + (": " + tail if tail else ""))
            if progress and result.seconds is not None:
                v = verdicts[index]
                mark = "ok" if v.ok else "NOT CAUGHT" if v.lost else "BROKEN"
                print(f"  {job.wrong.exercise}/{job.wrong.name}: {mark} ({v.seconds:.0f} s)", flush=True)

        grading = [GradingJob([*job.nodeids, "--target", str(job.target)], job.report) for _, job in ready]
        results = run_in_workers(grading, root, scratch / "workers", jobs, python, timeout=timeout, on_done=done)
        for position, result in enumerate(results):
            if ready[position][0] not in verdicts:
                done(position, result)
    return [verdicts[i] for i in range(len(wrongs))]


def _table(verdicts: list[Verdict]) -> str:
    rows = [("exercise", "mistake", "tests it targets", "points lost", "verdict")]
    for v in verdicts:
        lost = sum(p for p, _ in v.lost.values())
        possible = sum(q for _, q in v.lost.values())
        verdict = "loses points" if v.ok else ("NOT CAUGHT: " if v.lost and not v.reason.startswith("no graded")
                                               else "BROKEN: ") + v.reason
        points = f"{'≥' if v.partial else ''}{lost:g} / {possible:g}" if v.lost else "-"
        rows.append((v.wrong.exercise, f"{v.wrong.name}: {v.wrong.mistake}", ", ".join(v.wrong.loses), points, verdict))
    widths = [min(max(len(str(r[i])) for r in rows), cap) for i, cap in enumerate((8, 70, 60, 11, 60))]

    def cut(text, width):
        text = str(text)
        return text if len(text) <= width else text[: width - 1] + "…"

    lines = ["  ".join(cut(cell, w).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.instructor.selfcheck wrong-answers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exercises", nargs="*", help="e.g. ex04 (default: every exercise with a suite)")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="wrong answers graded at once")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        return worker(options.worker)  # a folder of queued jobs (run_in_workers)
    root = options.root.resolve()
    if not (root / "solutions").is_dir():
        print("no solutions/ here (a student release): no wrong answers to check")
        return 0
    wrongs = discover(root, options.exercises or None)
    if not wrongs:
        print("no wrong answers found under solutions/wrong_answers/" + (
            f" for {', '.join(options.exercises)}" if options.exercises else ""))
        return 1 if options.exercises else 0
    started = time.monotonic()
    print(f"grading {len(wrongs)} wrong answers in {options.jobs} worker processes, each on the tests it names "
          "(a test stops at its first failing parametrization)")
    verdicts = check(wrongs, root, options.jobs)
    print()
    print(_table(verdicts))
    bad = [v for v in verdicts if not v.ok]
    print(f"\n{len(verdicts) - len(bad)} of {len(verdicts)} wrong answers lose points "
          f"({time.monotonic() - started:.0f} s)")
    for v in bad:
        print(f"FAILED: {v.wrong.exercise}/{v.wrong.path.name}: {v.reason}")
    return 1 if bad else 0


if __name__ == "__main__":
    stopping.stop_like_ctrl_c()  # SIGTERM too stops the workers (run_in_workers' finally)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("stopped; the check did not finish", file=sys.stderr)
        sys.exit(130)
