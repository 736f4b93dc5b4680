"""`check("ex01")`: grade your exercise from a notebook, with a table of tests and points (notebook 00).

The tests run in a separate pytest process against exercises/ (or `target=`), so a mistake in
your code cannot hang or crash the notebook's kernel. `load_exercise("ex01")` imports your file
as it is now, to try a function before checking it.

    python -m course_lib.check ex01 [--target solutions]   the same in a terminal
"""

from __future__ import annotations

import html
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from course_lib import paths
from course_lib.grading.results import TestOutcome, read_report
from course_lib.tables import format_table

__all__ = ["check", "run_check", "load_exercise", "CheckResult"]


def load_exercise(exercise: str):
    """Your `exercises/exNN_*.py` as it is now on disk, freshly imported (notebook 00).

    Call it again after each edit. The module is also sent by value to ranks started with
    `launch`, so they run your latest code too.
    """
    import cloudpickle

    from course_lib.grading.runner import exercise_path, load_exercise_file

    module = load_exercise_file(exercise_path(exercise, paths.EXERCISES))
    cloudpickle.register_pickle_by_value(module)
    return module


@dataclass
class CheckResult:
    """The outcome of `check`: one row per test, and the points (notebook 00)."""

    exercise: str
    tests: list[TestOutcome] = field(default_factory=list)
    output: str = ""

    @property
    def earned(self) -> float:
        return sum(t.earned for t in self.tests)

    @property
    def possible(self) -> float:
        return sum(t.possible for t in self.tests)

    @property
    def all_passed(self) -> bool:
        return bool(self.tests) and all(t.outcome == "passed" or not t.graded for t in self.tests)

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(test, result, points, first line of the message); the cases of a parametrized test that all end
        the same way share one row, e.g. `test_ring [2, 3, 4]`, so a hint is not repeated on every line."""
        groups: dict[tuple, list[TestOutcome]] = {}
        for t in self.tests:
            function, _, case = t.nodeid.split("::", 1)[-1].partition("[")
            message = _first_line(t.not_graded or t.message).removeprefix(f"{self.exercise}: ")  # the table says which
            groups.setdefault((function, t.status, message), []).append(t)
        rows = []
        for (function, status, message), tests in groups.items():
            cases = [t.nodeid.partition("[")[2].rstrip("]") for t in tests]
            name = function + (f" [{', '.join(cases)}]" if any(cases) else "")
            mark = {"passed": "passed", "failed": "FAILED"}.get(status, status)
            points = "–" if status == "not graded" else (
                f"{sum(t.earned for t in tests):g} / {sum(t.possible for t in tests):g}")
            rows.append((name, mark, points, message))
        return rows

    def summary(self) -> str:
        return f"{self.exercise}: {self.earned:g} / {self.possible:g} points"

    def smallest_failing_inputs(self) -> list[tuple[str, str]]:
        """(test, input) for each failed test whose inputs Hypothesis drew: the smallest input it found that fails."""
        found = []
        for t in self.tests:
            unwritten = "not implemented yet" in _first_line(t.message)  # every input fails: nothing to learn from one
            shown = smallest_failing_input(t.message) if t.outcome == "failed" and not unwritten else ""
            if shown:
                found.append((t.nodeid.split("::", 1)[-1], shown))
        return found

    def _shown_rows(self) -> list[tuple[str, str, str, str, int]]:
        """rows() as the tables show them, (test, result, points, message, span), each message once: rows in a run
        with the same message share the first one's cell (span = the run's length, 0 for the others), and a
        message already shown further up reads "(same as above)"."""
        shown: list[list] = []
        seen: set[str] = set()
        run_message, run_start = None, 0
        for name, mark, points, message in self.rows():
            if message and message == run_message:
                shown[run_start][4] += 1
                shown.append([name, mark, points, message, 0])
                continue
            shown.append([name, mark, points, "(same as above)" if message in seen else message, 1])
            run_message, run_start = message, len(shown) - 1
            if message:
                seen.add(message)
        return [tuple(row) for row in shown]

    def __str__(self) -> str:
        rows = []
        for name, mark, points, message, span in self._shown_rows():
            message = "  〃" if span == 0 else (message[:100] + "…") if len(message) > 100 else message
            rows.append((name, mark, points, message))
        text = f"{format_table(['test', 'result', 'points', 'message'], rows)}\n{self.summary()}"
        inputs = self.smallest_failing_inputs()
        if inputs:
            text += "\nsmallest failing inputs (Hypothesis shrank them):" + "".join(
                f"\n  {name}: {shown}" for name, shown in inputs)
        return text

    def _repr_html_(self) -> str:
        colour = {"passed": "#1a7f37", "FAILED": "#cf222e", "not graded": "#6e7781"}
        # "✘ FAILED", "0 / 6" and a test's name never break over two lines (JupyterLab's <code> wraps by default)
        nowrap = "white-space:nowrap"
        # Rows that share a message share a shade too (JupyterLab's own stripes alternate row by row).
        shades = ["var(--jp-layout-color0, #fff)", "var(--jp-rendermime-table-row-background, #f5f5f5)"]
        body, group = [], -1
        inputs = dict(self.smallest_failing_inputs())
        for name, mark, points, message, span in self._shown_rows():
            group += span > 0
            icon = "✔ " if mark == "passed" else "✘ " if mark == "FAILED" else ""
            cells = (f"<td style='text-align:left'><code style='{nowrap}'>{html.escape(name)}</code></td>"
                     f"<td style='color:{colour.get(mark, '#9a6700')};font-weight:bold;{nowrap}'>{icon}{mark}</td>"
                     f"<td style='{nowrap}'>{html.escape(points)}</td>")
            if span:  # one cell for a run of rows with the same message
                shown = inputs.get(name.partition(" [")[0], "")
                extra = (f"<br><small>smallest failing input: <code>{html.escape(shown)}</code></small>"
                         if shown and span == 1 else "")
                cells += (f"<td rowspan='{span}' style='text-align:left;vertical-align:middle'>"
                          f"{html.escape(message)}{extra}</td>")
            body.append(f"<tr style='background:{shades[group % 2]}'>{cells}</tr>")
        return (
            f"<b>{html.escape(self.summary())}</b>"
            "<table><tr><th style='text-align:left'>test</th><th style='text-align:left'>result</th><th>points</th>"
            f"<th style='text-align:left'>message</th></tr>{''.join(body)}</table>"
        )


_HYPOTHESIS_MARKERS = ("Falsifying example: ", "Failing test case: ")  # older and newer Hypothesis
INPUT_SHOWN = 300  # characters of a shrunk input shown in the table; a tensor's repr can be long


def smallest_failing_input(message: str | None) -> str:
    """The arguments of Hypothesis's shrunk failing case in a test's message, on one line ('' if there is none).

    Hypothesis adds "Failing test case: test_x(\n    xs=[100],\n)" to the failure; the table shows "xs=[100]".
    """
    text = message or ""
    for marker in _HYPOTHESIS_MARKERS:
        start = text.find(marker)
        if start >= 0:
            break
    else:
        return ""
    call = text[start + len(marker):]
    lines = call.splitlines()
    body = []
    for line in lines[1:]:
        if line.startswith(")"):
            break
        body.append(line.strip())
    shown = " ".join(body).rstrip(",") if len(lines) > 1 else lines[0].partition("(")[2].rstrip(")")
    return shown if len(shown) <= INPUT_SHOWN else shown[:INPUT_SHOWN] + "…"


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else ""


def check(exercise: str, target: str = "exercises", timeout: float = 600.0) -> None:
    """Run the graded tests of `exercise` (e.g. "ex01") against your files and show a table of points (notebook 00)."""
    _show(run_check(exercise, target, timeout))


def run_check(exercise: str, target: str = "exercises", timeout: float = 600.0) -> CheckResult:
    """Run the graded tests of `exercise` against `target` and return the result without showing it (notebook 00)."""
    tests = sorted(paths.TESTS.glob(f"test_{exercise}_*.py"))
    if not tests:
        known = sorted(p.name.split("_")[1] for p in paths.TESTS.glob("test_ex*_*.py"))
        raise ValueError(f"no tests for {exercise!r}; exercises with tests: {', '.join(known) or 'none'}")
    with tempfile.TemporaryDirectory() as scratch:
        report_path = Path(scratch) / "report.jsonl"
        command = [sys.executable, "-m", "pytest", *map(str, tests), "--target", target, "-q",
                   "--course-report", str(report_path), "-p", "no:cacheprovider"]
        try:
            done = subprocess.run(command, cwd=paths.ROOT, capture_output=True, text=True, timeout=timeout)
            output = done.stdout + done.stderr
        except subprocess.TimeoutExpired as expired:
            output = f"the tests did not finish within {timeout:g} s and were stopped\n{expired.stdout or ''}"
        report = read_report(report_path)
        if report is None or (not report.tests and report.exitstatus is None):
            raise RuntimeError(f"pytest did not report any result for {exercise}; its output:\n{output[-3000:]}")
        return CheckResult(exercise, list(report.tests.values()), output)


def _show(result: CheckResult) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            display(result)
            return
    except ImportError:
        pass
    print(result)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m course_lib.check", description=__doc__)
    parser.add_argument("exercise", help="e.g. ex01")
    parser.add_argument("--target", default="exercises")
    options = parser.parse_args(argv)
    result = run_check(options.exercise, options.target)
    print(result)
    return 0 if result.all_passed else 1


if __name__ == "__main__":
    sys.exit(main())
