"""What the grader writes: Gradescope's results.json and a feedback page per student, the CSV gradebook."""

from __future__ import annotations

import csv
import json
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

    def earned(self, exercise: str | None = None, hidden: bool | None = None) -> float:
        return sum(t.earned for t in self.tests if (exercise is None or t.exercise == exercise)
                   and (hidden is None or t.hidden == hidden))

    def possible(self) -> float:
        return sum(t.possible for t in self.tests)


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


def write_results_json(result: Result, path: Path) -> None:
    names = _test_names(result.tests)
    tests = []
    for t in result.tests:
        entry = {"name": names[t.nodeid], "score": t.earned, "max_score": t.possible,
                 "visibility": "hidden" if t.hidden else "visible",
                 "output": t.message if not t.hidden else t.outcome}
        if t.status == "not graded":
            entry["output"] = f"not graded: {t.not_graded or t.message}"
        else:
            entry["status"] = t.outcome
        tests.append(entry)
    summary = f"Grading status: {result.status}." + (f" {result.detail}" if result.detail else "")
    data = {"score": result.earned(), "output": summary, "visibility": "visible", "stdout_visibility": "hidden",
            "tests": tests}
    path.write_text(json.dumps(data, indent=1))


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
    problems = [t for t in result.tests if t.status != "passed" and not t.hidden]
    if problems:
        lines += ["", "## What went wrong", ""]
        for t in problems:
            message = (t.not_graded or t.message).strip() or t.status
            if len(message) > 2000:
                message = message[:2000] + "\n…"
            lines += [f"### {names[t.nodeid]}", "", "```", message.replace("```", "'''"), "```", ""]
    if any(t.hidden for t in result.tests):
        lines += ["", "Hidden tests show only whether they passed."]
    path.write_text("\n".join(lines) + "\n")


def _exercise_columns(expected: list[TestOutcome]) -> list[tuple[str, str, bool]]:
    columns = []
    for exercise in sorted({t.exercise for t in expected}):
        columns.append((exercise, exercise, False))
        if any(t.hidden and t.exercise == exercise for t in expected):
            columns.append((f"{exercise} hidden", exercise, True))
    return columns


def write_gradebook(results: list[Result], expected: list[TestOutcome], path: Path) -> None:
    columns = _exercise_columns(expected)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "status", *(c[0] for c in columns), "total", "possible", "not graded",
                         "seconds", "detail"])
        for r in sorted(results, key=lambda r: r.student.lower()):
            if r.status == "grader error" and not r.tests:
                cells, total, possible = [""] * len(columns), "", ""
            else:
                cells = [f"{r.earned(ex, hidden):g}" for _, ex, hidden in columns]
                total, possible = f"{r.earned():g}", f"{r.possible():g}"
            not_graded = sum(1 for t in r.tests if t.status == "not graded")
            writer.writerow([r.student, r.status, *cells, total, possible, not_graded, f"{r.seconds:.1f}",
                             r.detail.replace("\n", " ")[:500]])
