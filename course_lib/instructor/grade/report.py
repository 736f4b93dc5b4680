"""What the grader writes: Gradescope's results.json and a feedback page per student, the CSV gradebook, and the
class's summary (summary.md and summary.csv: the hardest tests, points per exercise, statuses, flagged students)."""

from __future__ import annotations

import csv
import json
import re
import statistics
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.grading.results import StubGroup, TestOutcome, stub_groups, unwritten

STATUSES = ("ok", "timeout", "crashed", "grader error")


@dataclass
class Result:
    """One student's grading: a status (one of STATUSES), why, and every expected graded test."""

    student: str
    status: str
    detail: str
    tests: list[TestOutcome] = field(default_factory=list)
    seconds: float = 0.0
    source: str = ""  # where in the submission the exercise files were found
    isolation: str = ""  # the sandbox that graded it: bwrap, unshare (the fallback) or none
    outside: list[str] = field(default_factory=list)  # 'opened PATH' / 'ran PROGRAM' outside its allow-list

    def earned(self, exercise: str | None = None, hidden: bool | None = None) -> float:
        return sum(t.earned for t in self.tests if (exercise is None or t.exercise == exercise)
                   and (hidden is None or t.hidden == hidden))

    def possible(self, exercise: str | None = None, hidden: bool | None = None) -> float:
        return sum(t.possible for t in self.tests if (exercise is None or t.exercise == exercise)
                   and (hidden is None or t.hidden == hidden))

    @property
    def graded(self) -> bool:
        """Whether it has a row of points (a grader error before any test ran has none)."""
        return bool(self.tests)


def _test_names(tests: list[TestOutcome]) -> dict[str, str]:
    """A name per test for students: hidden tests are numbered per exercise, never named."""
    names, counts = {}, {}
    for t in tests:
        if t.hidden:
            counts[t.exercise] = counts.get(t.exercise, 0) + 1
            names[t.nodeid] = f"{t.exercise}: hidden test {counts[t.exercise]}"
        else:
            names[t.nodeid] = f"{t.exercise}: {t.nodeid.split('::', 1)[-1]}"
    return names


def results_json(result: Result, *, hidden_visibility: str = "hidden", preamble: list[str] = (),
                 epilogue: list[str] = (), execution_time: float | None = None) -> dict:
    """Gradescope's results.json for one student. hidden_visibility: "hidden" (the class grader: never shown) or
    "after_published" (the Gradescope package: shown once the grades are published). preamble: lines for the top of
    the output that every student sees (what was wrong with the submission); epilogue: lines after the status."""
    names = _test_names(result.tests)
    tests = []
    for t in result.tests:
        stub = unwritten(t)  # its hint says it all: every input fails a stub the same way
        entry = {"name": names[t.nodeid], "score": t.earned, "max_score": t.possible,
                 "visibility": hidden_visibility if t.hidden else "visible",
                 "output": t.outcome if t.hidden else stub.message if stub is not None else t.message}
        if t.status == "not graded":
            entry["output"] = f"not graded: {t.not_graded or t.message}"
        else:
            entry["status"] = t.outcome
        tests.append(entry)
    summary = f"Grading status: {result.status}." + (f" {result.detail}" if result.detail else "")
    # extra_data: Gradescope stores it and does not show it to the student; the instructor's record of the grading.
    data = {"score": result.earned(), "output": "\n\n".join([*preamble, summary, *epilogue]), "visibility": "visible",
            "stdout_visibility": "hidden",
            "extra_data": {"isolation": result.isolation, "opened_outside_allow_list": result.outside,
                           "seconds_per_exercise": _seconds_per_exercise(result)},
            "tests": tests}
    if execution_time is not None:
        data["execution_time"] = round(execution_time)
    return data


def _seconds_per_exercise(result: Result) -> dict[str, float]:
    """How long the judge spent in each exercise's tests (benchmarks/grade_class.py shows where a student's time goes)."""
    seconds: dict[str, float] = {}
    for t in result.tests:
        seconds[t.exercise] = seconds.get(t.exercise, 0.0) + (t.duration or 0.0)
    return {exercise: round(value, 2) for exercise, value in seconds.items()}


def write_results_json(result: Result, path: Path) -> None:
    path.write_text(json.dumps(results_json(result), indent=1))


NOT_GRADED_HEADING = "## Not graded on this machine (needs a GPU)"
UNWRITTEN_HEADING = "## Not implemented yet"
FEEDBACK_WIDTH = 100  # characters a line of feedback.md, outside the quoted messages of "What went wrong"
MESSAGE_CHARS = 2000  # of one failure's message


def _first_line(text: str) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


def _wrapped(text: str, first: str = "", rest: str = "  ") -> list[str]:
    return textwrap.wrap(text, FEEDBACK_WIDTH, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False) or [first.rstrip()]


def _cut(text: str, width: int = FEEDBACK_WIDTH) -> str:
    """`text` on one line of at most `width` characters: cut at a space, with '…', where it is longer."""
    if len(text) <= width:
        return text
    return text[:width - 1].rsplit(" ", 1)[0].rstrip(" ,;:(") + "…"


def _plain(text: str) -> str:
    """`text` as Markdown shows it as written: a `_` not between two letters or digits (as in `__init__`) and a `*`
    not between two spaces (as in `*items`) are escaped; code in backticks is left alone."""
    parts = re.split(r"(`[^`]*`)", text)
    for k in range(0, len(parts), 2):
        parts[k] = re.sub(r"_(?<![A-Za-z0-9]_(?=[A-Za-z0-9]))|\*(?<!\s\*(?=\s))", lambda m: "\\" + m.group(0),
                          parts[k])
    return "".join(parts)


def _exercise_table(result: Result) -> list[str]:
    lines = ["| exercise | points | tests passed | not graded |", "|---|---|---|---|"]
    for exercise in dict.fromkeys(t.exercise for t in result.tests):
        tests = [t for t in result.tests if t.exercise == exercise]
        graded = [t for t in tests if t.status != "not graded"]
        passed = sum(t.outcome == "passed" for t in graded)
        skipped = len(tests) - len(graded)
        lines.append(f"| {exercise} | {result.earned(exercise):g} / {result.possible(exercise):g} | "
                     f"{passed} of {len(graded)} | {skipped or '–'} |")
    return lines


def _not_started(result: Result) -> set[str]:
    """The exercises where every graded test stopped at an untouched stub: none passed, none failed another way."""
    graded = [t for t in result.tests if t.status != "not graded"]
    return {e for e in {t.exercise for t in graded}
            if all(unwritten(t) is not None for t in graded if t.exercise == e)}


def _unwritten_lines(groups: list[StubGroup], not_started: set[str]) -> list[str]:
    """One entry per untouched stub: the hint whole, or cut to a line in an exercise not started."""
    lines = [UNWRITTEN_HEADING, ""]
    lines += _wrapped("These functions still raise their stub's `NotImplementedError`. Every test that reaches one "
                      "fails at once, whatever its input, so each shows here once, with its hint, how many tests "
                      "stopped there and the points they are worth.", rest="")
    lines.append("")
    cut = []
    for group in groups:
        stub = group.stub
        head = f"* **{stub.exercise} · `{stub.function}`** ({group.counts()})" if stub.function else (
            f"* **{stub.exercise}** ({group.counts()})")
        if stub.exercise in not_started:
            cut.append(stub.exercise)
            lines.append(_cut(f"{head}: {_plain(stub.hint)}") if stub.hint else head)
        else:
            lines += _wrapped(f"{head}: {_plain(stub.hint)}" if stub.hint else head)
    if cut:
        lines += [""] + _wrapped(f"Not started yet: {', '.join(dict.fromkeys(cut))}. Their hints are cut to a line "
                                 "here; each is whole in your exercise file, where the function raises "
                                 "`NotImplementedError`.", rest="")
    return lines


def _failure_lines(failures: list[TestOutcome], names: dict[str, str]) -> list[str]:
    """Each other failure's message once (tests that failed the same way share it): what the code did, the
    traceback where it raised, and the smallest input Hypothesis found that fails."""
    lines = ["## What went wrong", ""]
    same: dict[str, list[TestOutcome]] = {}
    for t in failures:
        same.setdefault(t.message.strip() or t.status, []).append(t)
    for message, tests in same.items():
        if len(message) > MESSAGE_CHARS:
            message = message[:MESSAGE_CHARS] + "\n…"
        shown = [names[t.nodeid] for t in tests]
        heading = ", ".join(shown) if len(shown) <= 3 else f"{', '.join(shown[:2])} and {len(shown) - 2} more tests"
        lines += [f"### {heading}", "", "```", message.replace("```", "'''"), "```", ""]
    return lines


def write_feedback(result: Result, path: Path) -> None:
    """feedback.md: the points per exercise, the tests not graded here, each untouched stub once (its hint, its
    tests and points; grading.results.stub_groups, as `check`'s table groups them), then every other failure with
    its message (and Hypothesis's smallest failing input). Hidden tests show only in the points."""
    names = _test_names(result.tests)
    lines = [f"# Feedback for {result.student}", ""]
    if result.status == "grader error":
        lines += ["Your submission could not be graded automatically; your instructor will look at it.", "",
                  f"Reason: {result.detail}", ""]
        path.write_text("\n".join(lines) + "\n")
        return
    lines += [f"**{result.earned():g} / {result.possible():g} points** (grading status: {result.status})", ""]
    if result.detail:
        lines += _wrapped(f"Note: {result.detail}", rest="") + [""]
    lines += _exercise_table(result)
    skipped = [t for t in result.tests if t.status == "not graded"]
    if skipped:  # before what went wrong: a perfect score's page says why its points possible are fewer
        lines += ["", NOT_GRADED_HEADING, "", "These tests count in neither your points nor the points possible.", ""]
        reasons: dict[tuple[str, str], list[str]] = {}
        for t in skipped:
            reason = _first_line(t.not_graded or t.message) or "skipped"
            reasons.setdefault((t.exercise, reason), []).append(names[t.nodeid].split(": ", 1)[-1])
        for (exercise, reason), tests in reasons.items():
            lines += _wrapped(f"* {exercise} ({reason}): {', '.join(tests)}")
    visible = [t for t in result.tests if not t.hidden]
    groups = stub_groups(visible)
    if groups:
        lines += [""] + _unwritten_lines(groups, _not_started(result))
    failures = [t for t in visible if t.status == "failed" and unwritten(t) is None]
    if failures:
        lines += [""] + _failure_lines(failures, names)
    if any(t.hidden for t in result.tests):
        lines += ["", "Hidden tests count in the points above and show nothing else."]
    while lines and not lines[-1]:
        lines.pop()
    path.write_text("\n".join(lines) + "\n")


def _exercise_columns(expected: list[TestOutcome]) -> list[tuple[str, str, bool]]:
    """(column, exercise, hidden): ex00, then ex00_hidden where the exercise has hidden tests."""
    columns = []
    for exercise in sorted({t.exercise for t in expected}):
        columns.append((exercise, exercise, False))
        if any(t.hidden and t.exercise == exercise for t in expected):
            columns.append((f"{exercise}_hidden", exercise, True))
    return columns


GRADEBOOK_TAIL = ["total", "possible", "not graded", "isolation", "opened outside", "seconds", "detail"]


def write_gradebook(results: list[Result], expected: list[TestOutcome], path: Path) -> None:
    """grades.csv: a row per student; points earned and possible per exercise (ex00, ex00_possible; hidden tests
    apart), the total, the isolation that graded it and how many files its code opened outside its allow-list."""
    columns = _exercise_columns(expected)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "status", *(name for c in columns for name in (c[0], f"{c[0]}_possible")),
                         *GRADEBOOK_TAIL])
        for r in sorted(results, key=lambda r: r.student.lower()):
            if not r.graded:
                cells, total, possible = [""] * (2 * len(columns)), "", ""
            else:
                cells = [f"{value:g}" for _, ex, hidden in columns
                         for value in (r.earned(ex, hidden), r.possible(ex, hidden))]
                total, possible = f"{r.earned():g}", f"{r.possible():g}"
            not_graded = sum(1 for t in r.tests if t.status == "not graded")
            writer.writerow([r.student, r.status, *cells, total, possible, not_graded, r.isolation, len(r.outside),
                             f"{r.seconds:.1f}", r.detail.replace("\n", " ")[:500]])


@dataclass
class TestSummary:
    """How the class did on one graded test."""

    nodeid: str
    points: float
    passed: int = 0  # students who passed it
    graded: int = 0  # students it was graded for

    __test__ = False  # not a test class, whatever pytest thinks of its name

    @property
    def rate(self) -> float:
        return self.passed / self.graded if self.graded else 0.0

    @property
    def name(self) -> str:
        """'ex00: test_x[2]', or 'ex00 hidden: test_y' (the instructor's summary names hidden tests)."""
        outcome = TestOutcome(self.nodeid)
        return f"{outcome.exercise}{' hidden' if outcome.hidden else ''}: {self.nodeid.split('::', 1)[-1]}"


def pass_rates(results: list[Result]) -> list[TestSummary]:
    """Every graded test, hardest first: lowest pass rate, then most points, then name."""
    found: dict[str, TestSummary] = {}
    for r in results:
        for t in r.tests:
            if t.points is None or t.status == "not graded":
                continue
            entry = found.setdefault(t.nodeid, TestSummary(t.nodeid, t.possible))
            entry.graded += 1
            entry.passed += t.outcome == "passed"
    return sorted(found.values(), key=lambda e: (e.rate, -e.points, e.nodeid))




def _points(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def write_summary(results: list[Result], expected: list[TestOutcome], folder: Path) -> None:
    """summary.md (the class at a glance) and summary.csv (each graded test's pass rate, hardest first)."""
    graded = [r for r in results if r.graded]
    counts = {status: sum(r.status == status for r in results) for status in STATUSES}
    isolations = sorted({r.isolation for r in results if r.isolation})
    weak = [mode for mode in isolations if mode != "bwrap"]
    lines = ["# Class summary", "",
             f"{len(results)} submissions, graded with isolation {', '.join(isolations) or 'unknown'}"
             + (f" ({', '.join(weak)}: the fallback, where student code could read files outside its allow-list; "
                "see the files opened outside it below)" if weak else "") + ".",
             "", "| status | students |", "|---|---|"]
    lines += [f"| {status} | {n} |" for status, n in counts.items()]
    lines += ["", "## Points per exercise", "",
              f"Over the {len(graded)} submissions graded (a grader error before any test ran is left out).", "",
              "| exercise | possible | mean | median | full marks |", "|---|---|---|---|---|"]
    rows = [(column, lambda r, e=exercise, h=hidden: (r.earned(e, h), r.possible(e, h)))
            for column, exercise, hidden in _exercise_columns(expected)]
    rows.append(("total", lambda r: (r.earned(), r.possible())))
    for column, points in rows:
        earned = [points(r)[0] for r in graded]
        possible = max((points(r)[1] for r in graded), default=0.0)
        full = sum(1 for r in graded if points(r)[1] and points(r)[0] >= points(r)[1])
        mean = _points(statistics.fmean(earned)) if earned else "–"
        median = _points(statistics.median(earned)) if earned else "–"
        lines.append(f"| {column} | {_points(possible)} | {mean} | {median} | {full} of {len(graded)} |")
    summaries = pass_rates(graded)
    lines += ["", "## Tests, hardest first", "", "| test | points | passed | pass rate |", "|---|---|---|---|"]
    lines += [f"| {t.name} | {_points(t.points)} | {t.passed} of {t.graded} | {t.rate:.0%} |" for t in summaries]
    not_graded = sorted({t.nodeid for r in graded for t in r.tests if t.status == "not graded"})
    if not_graded:
        lines += ["", "Not graded on this machine (it lacks the GPUs they need): "
                  + ", ".join(f"`{TestSummary(n, 0).name}`" for n in not_graded) + "."]
    flagged = [r for r in results if r.outside]
    lines += ["", "## Files opened outside the allow-list", ""]
    if flagged:
        lines += ["Student code opened these files outside what it may read (Python, its packages, the course "
                  "library, its own folder), or ran these programs. Under bwrap those opens failed; under the "
                  "fallback (unshare, none) they may have succeeded, and the points may be copied: read the "
                  "submission.", "", "| student | isolation | points | opened or ran |", "|---|---|---|---|"]
        for r in flagged:
            shown = "; ".join(f"`{line}`" for line in r.outside[:5]) + (
                f"; and {len(r.outside) - 5} more" if len(r.outside) > 5 else "")
            points = f"{r.earned():g} / {r.possible():g}" if r.graded else "–"
            lines.append(f"| {r.student} | {r.isolation} | {points} | {shown} |")
    else:
        lines.append("None: no student's code opened a file outside its allow-list.")
    problems = [r for r in results if r.status != "ok"]
    if problems:
        lines += ["", "## Not ok", ""] + [f"* {r.student}: {r.status}: {_first_line(r.detail)}" for r in problems]
    (folder / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with open(folder / "summary.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["test", "exercise", "hidden", "points", "passed", "graded", "pass rate"])
        for t in summaries:
            outcome = TestOutcome(t.nodeid)
            writer.writerow([t.nodeid, outcome.exercise, "yes" if outcome.hidden else "no", f"{t.points:g}",
                             t.passed, t.graded, f"{t.rate:.3f}"])
