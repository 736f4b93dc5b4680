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
(`wrong_answers.run_in_workers`: torch and the fork server start once per worker, pytest runs
in-process for one mutant after another, under the Hypothesis profile without shrinking).

It is a report: it exits 0 whatever survives, and 1 only when no mutant could be made (or graded).
"""

from __future__ import annotations

import argparse
import ast
import copy
import random
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from course_lib.grading.results import read_report
from course_lib.paths import ROOT

__all__ = ["OPERATORS", "Mutant", "Outcome", "solution_blocks", "mutate", "mutants_of", "grade", "main"]

BEGIN = re.compile(r"^\s*# BEGIN SOLUTION(?::.*)?$")  # the markers of course_lib/instructor/exercises.py
END = re.compile(r"^\s*# END SOLUTION\s*$")

OPERATORS = {
    "comparison": "< <-> <=, > <-> >=, == <-> !=, is <-> is not, in <-> not in",
    "arithmetic": "+ <-> -, * <-> /, / <-> //, in expressions and augmented assignments",
    "constant": "an integer constant n -> n + 1 and n - 1",
    "dim": "dim=/axis= k -> the others of 0, 1, -1",
    "swap_args": "two neighbouring positional arguments of a call swapped",
    "drop_statement": "a statement (not a return) replaced by pass",
    "sum_mean": ".sum <-> .mean (methods and torch.sum/torch.mean)",
    "boolean": "and <-> or, True <-> False",
    "remove_not": "not x -> x",
    "return_none": "return x -> return None",
}

_COMPARISONS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_ARITHMETIC = {ast.Add: [ast.Sub], ast.Sub: [ast.Add], ast.Mult: [ast.Div], ast.Div: [ast.Mult, ast.FloorDiv],
               ast.FloorDiv: [ast.Div]}
_DIM_KEYWORDS = {"dim", "axis"}


@dataclass
class Mutant:
    """One small change to a solution: which operator, where, the changed line before and after, the whole file."""

    exercise: str
    number: int  # its place in the exercise's list of every mutant (stable whatever --limit or --operator pick)
    operator: str
    function: str
    line: int
    old: str
    new: str
    source: str = field(repr=False)

    @property
    def name(self) -> str:
        return f"{self.exercise}#{self.number}"

    def diff(self, width: int = 110) -> str:
        def cut(text: str) -> str:
            return text if len(text) <= width else text[: width - 1] + "…"

        return f"-  {cut(self.old)}\n+  {cut(self.new)}"


@dataclass
class Outcome:
    """What grading one mutant gave: killed, survived, timed out, or error (no report: it could not be graded)."""

    mutant: Mutant
    status: str
    seconds: float | None = None
    failed: list[str] = field(default_factory=list)  # the graded tests that failed (the first one, with -x)
    reason: str = ""


def solution_blocks(source: str) -> list[tuple[int, int]]:
    """The (first, last) line numbers, 1-based and inclusive, of the code inside each SOLUTION block."""
    blocks, start = [], None
    for number, line in enumerate(source.splitlines(), start=1):
        if BEGIN.match(line):
            start = number + 1
        elif END.match(line) and start is not None:
            blocks.append((start, number - 1))
            start = None
    return blocks


def _int_value(node: ast.AST) -> int | None:
    """The value of an integer literal, -1 included (a unary minus on a constant); None for anything else."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and _int_value(node.operand) is not None:
        return -_int_value(node.operand)
    return None


def _int_node(value: int) -> ast.expr:
    return ast.Constant(value) if value >= 0 else ast.UnaryOp(ast.USub(), ast.Constant(-value))


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)))


def _replacements(node: ast.AST, parent: ast.AST | None) -> Iterator[tuple[str, ast.AST]]:
    """Every (operator, replacement node) for one node of the solution."""
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _COMPARISONS:
                new = copy.deepcopy(node)
                new.ops[i] = _COMPARISONS[type(op)]()
                yield "comparison", new
    if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _ARITHMETIC:
        operands = [node.left, node.right] if isinstance(node, ast.BinOp) else [node.value]
        if not any(_is_text(o) for o in operands):  # "a" + "b" is joining text, not arithmetic
            for op in _ARITHMETIC[type(node.op)]:
                new = copy.deepcopy(node)
                new.op = op()
                yield "arithmetic", new
    value = _int_value(node)
    if value is not None and not (isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.USub)):
        if isinstance(parent, ast.keyword) and parent.arg in _DIM_KEYWORDS:
            others = [v for v in (0, 1, -1) if v != value] if value in (0, 1, -1) else [value + 1, value - 1]
            for other in others:
                yield "dim", _int_node(other)
        else:
            for other in (value + 1, value - 1):
                yield "constant", _int_node(other)
    if isinstance(node, ast.Call) and not any(isinstance(a, ast.Starred) for a in node.args):
        for i in range(len(node.args) - 1):
            new = copy.deepcopy(node)
            new.args[i], new.args[i + 1] = new.args[i + 1], new.args[i]
            yield "swap_args", new
    if isinstance(node, ast.stmt) and not isinstance(node, (ast.Return, ast.Pass)):
        if not (isinstance(node, ast.Expr) and _is_text(node.value)):
            yield "drop_statement", ast.Pass()
    if isinstance(node, ast.Attribute) and node.attr in ("sum", "mean"):
        new = copy.deepcopy(node)
        new.attr = "mean" if node.attr == "sum" else "sum"
        yield "sum_mean", new
    if isinstance(node, ast.BoolOp):
        new = copy.deepcopy(node)
        new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield "boolean", new
    if isinstance(node, ast.Constant) and type(node.value) is bool:
        yield "boolean", ast.Constant(not node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "remove_not", copy.deepcopy(node.operand)
    if isinstance(node, ast.Return) and node.value is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None):
        yield "return_none", ast.Return(ast.Constant(None))


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, ast.AST | None, str, bool]]:
    """(node, parent, enclosing function's qualified name, inside an f-string) for every node, in a fixed order."""
    def visit(node, parent, scope, in_text):
        yield node, parent, scope, in_text
        inner = scope
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = f"{scope}.{node.name}" if scope else node.name
        for child in ast.iter_child_nodes(node):
            yield from visit(child, node, inner, in_text or isinstance(node, ast.JoinedStr))

    yield from visit(tree, None, "", False)


def _offset(lines: list[str], line: int, column: int) -> int:
    """The character offset of (1-based line, UTF-8 byte column) in the text split into `lines` (with ends)."""
    before = sum(len(text) for text in lines[: line - 1])
    return before + len(lines[line - 1].encode()[:column].decode())


def _swapped(parent: ast.AST, node: ast.AST, replacement: ast.AST) -> Callable[[], None]:
    """Put `replacement` where `node` is in `parent`, in place; return what puts `node` back."""
    for name, value in ast.iter_fields(parent):
        if value is node:
            setattr(parent, name, replacement)
            return lambda: setattr(parent, name, node)
        if isinstance(value, list):
            for i, item in enumerate(value):
                if item is node:
                    value[i] = replacement
                    return lambda: value.__setitem__(i, node)
    raise ValueError("the node is not a child of its parent")


def mutate(source: str, exercise: str = "ex") -> tuple[list[Mutant], Counter]:
    """Every mutant of `source` made inside its SOLUTION blocks, and a count of those skipped and why.

    Each mutant's text is the solution with only the mutated node's characters changed, so comments and
    layout stay; it must compile, and it must parse to a tree that differs from the solution's (swapping
    two equal arguments changes nothing) and equals the intended one (else parentheses were needed and
    are tried, or the mutant is skipped).
    """
    tree = ast.parse(source)
    blocks = solution_blocks(source)
    lines = source.splitlines(keepends=True)
    made: list[Mutant] = []
    skipped: Counter = Counter()
    seen: set[str] = set()
    originals: dict[int, str] = {}  # the dump of each module-level statement
    for node, parent, scope, in_text in _walk(tree):
        if in_text or not hasattr(node, "lineno") or isinstance(node, ast.keyword):
            continue
        if not any(first <= node.lineno and node.end_lineno <= last for first, last in blocks):
            continue
        # Only the node's characters change, so comparing the module-level statement around it is enough.
        top = next(i for i, stmt in enumerate(tree.body) if stmt.lineno <= node.lineno <= stmt.end_lineno)
        if top not in originals:
            originals[top] = ast.dump(tree.body[top])
        original = originals[top]
        start = _offset(lines, node.lineno, node.col_offset)
        stop = _offset(lines, node.end_lineno, node.end_col_offset)
        for operator, replacement in _replacements(node, parent):
            put_back = _swapped(parent, node, replacement)
            wanted = ast.dump(tree.body[top])
            put_back()
            text = ast.unparse(replacement)
            if source.startswith("elif", start) and isinstance(parent, ast.If):  # dropping an elif: else: pass
                text = f"else:\n{' ' * parent.body[0].col_offset}{text}"
            for candidate in (text, f"({text})") if isinstance(node, ast.expr) else (text,):
                mutated = source[:start] + candidate + source[stop:]
                try:
                    body = ast.parse(mutated).body
                except SyntaxError:
                    continue
                got = ast.dump(body[top]) if len(body) == len(tree.body) else None
                if got == wanted:
                    break
            else:
                skipped[f"{operator}: does not parse as meant"] += 1
                continue
            if got == original:
                skipped[f"{operator}: the same program"] += 1
                continue
            if mutated in seen:
                skipped[f"{operator}: the same as another mutant"] += 1
                continue
            try:
                compile(mutated, f"{exercise}.py", "exec")
            except SyntaxError:  # parses, but e.g. a return outside a function
                skipped[f"{operator}: does not compile"] += 1
                continue
            seen.add(mutated)
            new_lines = mutated.splitlines()
            old = lines[node.lineno - 1].strip() + (" …" if node.end_lineno > node.lineno else "")
            new = " ".join(line.strip() for line in new_lines[node.lineno - 1: node.lineno + candidate.count("\n")])
            made.append(Mutant(exercise, len(made), operator, scope or "<module>", node.lineno, old, new, mutated))
    return made, skipped


def _solution(root: Path, exercise: str) -> Path | None:
    matches = sorted((root / "solutions").glob(f"{exercise}_*.py"))
    return matches[0] if matches else None


def _tests(root: Path, exercise: str) -> Path | None:
    matches = sorted((root / "tests").glob(f"test_{exercise}_*.py"))
    return matches[0] if matches else None


def mutants_of(exercise: str, root: Path = ROOT, operators: list[str] | None = None,
               limit: int | None = None) -> tuple[list[Mutant], Counter]:
    """The exercise's mutants, only those of `operators` if given, then at most `limit` of them (a fixed sample)."""
    solution = _solution(root, exercise)
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
    from course_lib.instructor.wrong_answers import GradingJob, run_in_workers

    if not mutants:
        return []
    with tempfile.TemporaryDirectory(prefix="course-mutants-") as scratch_name:
        scratch = Path(scratch_name)
        grading, reports = [], []
        for mutant in mutants:
            solution, tests = _solution(root, mutant.exercise), _tests(root, mutant.exercise)
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


def _default_jobs() -> int:
    from course_lib.instructor.wrong_answers import _default_jobs as jobs

    return jobs()


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
    jobs = options.jobs or _default_jobs()
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
        if _tests(root, exercise) is None:
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
    header = ("exercise", "mutants", "killed", "survived", "timed out", "error", "score", "seconds")
    print("\n" + _table([header, *summary]))
    print("\n" + _table([("operator",) + header[1:-1], *[_summary_row(k, v) for k, v in sorted(by_operator.items())]]))
    print("\nscore = (killed + timed out) / (mutants - error); a timed-out mutant hung or crawled, which the "
          f"tests saw (--timeout {options.timeout:g} s)")
    for o in survivors:
        m = o.mutant
        label = {"survived": "SURVIVED", "timed out": "TIMED OUT", "error": "ERROR"}[o.status]
        print(f"\n{label} {m.name} {m.operator} in {m.function}, line {m.line}"
              + (f": {o.reason}" if o.reason else ""))
        print("\n".join("    " + line for line in m.diff().splitlines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
