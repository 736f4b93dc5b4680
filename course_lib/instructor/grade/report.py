"""What the grader writes: Gradescope's results.json and a feedback page per student, the CSV gradebook, and the
class's summary (summary.md and summary.csv: the hardest tests, points per exercise, statuses, flagged students)."""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.grading.results import TestOutcome

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
        entry = {"name": names[t.nodeid], "score": t.earned, "max_score": t.possible,
                 "visibility": hidden_visibility if t.hidden else "visible",
                 "output": t.message if not t.hidden else t.outcome}
        if t.status == "not graded":
            entry["output"] = f"not graded: {t.not_graded or t.message}"
        else:
            entry["status"] = t.outcome
        tests.append(entry)
    summary = f"Grading status: {result.status}." + (f" {result.detail}" if result.detail else "")
    # extra_data: Gradescope stores it and does not show it to the student; the instructor's record of the grading.
    data = {"score": result.earned(), "output": "\n\n".join([*preamble, summary, *epilogue]), "visibility": "visible",
            "stdout_visibility": "hidden",
            "extra_data": {"isolation": result.isolation, "opened_outside_allow_list": result.outside},
            "tests": tests}
    if execution_time is not None:
        data["execution_time"] = round(execution_time)
    return data


def write_results_json(result: Result, path: Path) -> None:
    path.write_text(json.dumps(results_json(result), indent=1))


NOT_GRADED_HEADING = "## Not graded on this machine (needs a GPU)"


def _first_line(text: str) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


def write_feedback(result: Result, path: Path) -> None:
    names = _test_names(result.tests)
    lines = [f"# Feedback for {result.student}", ""]
    if result.status == "grader error":
        lines += ["Your submission could not be graded automatically; your instructor will look at it.", "",
                  f"Reason: {result.detail}", ""]
        path.write_text("\n".join(lines) + "\n")
        return
    lines += [f"**{result.earned():g} / {result.possible():g} points** (grading status: {result.status})", ""]
    if result.detail:
        lines += [f"Note: {result.detail}", ""]
    lines += ["| test | result | points |", "|---|---|---|"]
    for t in result.tests:
        points = "–" if t.status == "not graded" else f"{t.earned:g} / {t.possible:g}"
        lines.append(f"| {names[t.nodeid]} | {t.status} | {points} |")
    problems = [t for t in result.tests if t.status == "failed" and not t.hidden]
    skipped = [t for t in result.tests if t.status == "not graded"]
    if skipped:  # before what went wrong: a perfect score's page says why its points possible are fewer
        lines += ["", NOT_GRADED_HEADING, "", "These tests count in neither your points nor the points possible.", ""]
        lines += [f"* {names[t.nodeid]}: {_first_line(t.not_graded or t.message) or 'skipped'}" for t in skipped]
    if problems:
        lines += ["", "## What went wrong", ""]
        for t in problems:
            message = t.message.strip() or t.status
            if len(message) > 2000:
                message = message[:2000] + "\n…"
            lines += [f"### {names[t.nodeid]}", "", "```", message.replace("```", "'''"), "```", ""]
    if any(t.hidden for t in result.tests):
        lines += ["", "Hidden tests show only whether they passed."]
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
