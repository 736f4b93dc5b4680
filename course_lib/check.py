"""`check("ex01")`: grade your exercise from a notebook, with a table of tests and points (notebook 00).

The tests run in a separate pytest process against exercises/ (or `target=`), so a mistake in
your code cannot hang or crash the notebook's kernel. Each test shows as it finishes, and a test
that takes long says how long it may take. Each test gets the grader's time limit (4 × the reference
solution's time, at least 3 s, as the instructor's grader computes it); check lets it run twice that
long, and a test that passes only in that extra time is shown as "too slow" and earns nothing here,
as it would earn nothing when graded. Where your code raised, the file, line and your own frames of
the traceback show once under the table. `load_exercise("ex01")` imports your file as it is now, to
try a function before checking it.

    python3 course.py check ex01 [--target solutions] [-v]   the same in a terminal (-v: whole messages)
    python3 course.py check --record-reference-times [ex01]  (course developers) time the reference
                                                             solutions into tests/reference_times.json
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from course_lib import paths, stopping
from course_lib.tables import plural
from course_lib.grading import time_rule
from course_lib.grading.results import TestOutcome, read_report, unwritten

__all__ = ["check", "run_check", "load_exercise", "CheckResult", "TimeRule", "record_reference_times"]

REFERENCE_TIMES = paths.TESTS / "reference_times.json"  # each graded test's time with the reference solution
GRACE = 2.0  # check stops a test at this many times the grader's limit, so a slow answer shows how slow it is
LONG_WAIT = 10  # seconds: without a bar (a log), a test that runs this long says so, and what its limit is
NOTEBOOK_WIDTH = 100  # characters: a notebook's output area breaks longer lines mid-word


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


# ------------------------------------------------------------------------------------------------ time limits


@dataclass
class TimeRule:
    """The grader's time limit of each test, from the reference solution's time (notebook 00).

    The rule and its numbers are the instructor's grader's own (course_lib/grading/time_rule.py); the
    reference times were measured by grading the reference solutions
    (tests/reference_times.json, written by `python3 course.py check --record-reference-times`).
    """

    factor: float
    floor: float
    ceiling: float
    reference: dict[str, float] = field(default_factory=dict)  # nodeid -> the reference solution's seconds
    measured_on: str = ""

    @classmethod
    def load(cls, path: str | os.PathLike | None = REFERENCE_TIMES) -> "TimeRule":
        data = {}
        if path is not None:
            try:
                data = json.loads(Path(path).read_text())
            except (OSError, ValueError):
                data = {}
        return cls(time_rule.FACTOR, time_rule.FLOOR, time_rule.CEILING, dict(data.get("durations", {})),
                   data.get("measured_on", ""))

    def grader_limit(self, nodeid: str) -> float | None:
        """The grader's limit for this test, in seconds; None where no reference time was recorded for it."""
        if nodeid not in self.reference:
            return None
        return time_rule.calibrated_limits({nodeid: self.reference[nodeid]}, self.factor, self.floor, self.ceiling)[nodeid]

    def stop_after(self, nodeid: str) -> float:
        """Where check stops the test: GRACE × the grader's limit, at most the grader's ceiling (without a
        reference time, the ceiling, which is what the grader gives a test it did not calibrate)."""
        limit = self.grader_limit(nodeid)
        return self.ceiling if limit is None else round(min(self.ceiling, GRACE * limit), 1)

    def note(self) -> str:
        return (f"the grader gives each test {self.factor:g} × the reference solution's time, at least "
                f"{self.floor:g} s" + (f" (reference times measured on {self.measured_on})" if self.measured_on else ""))


# ------------------------------------------------------------------------------------------------ the result


_TIMEOUT = time_rule.TIMED_OUT
_FRAME = re.compile(r'^(?P<indent>\s*)File "(?P<path>[^"]+)", line (?P<line>\d+)(?:, in (?P<function>.+))?$')


@dataclass
class CheckResult:
    """The outcome of `check`: one row per test, and the points (notebook 00)."""

    exercise: str
    tests: list[TestOutcome] = field(default_factory=list)
    output: str = ""
    rule: TimeRule | None = None  # the grader's time limits, where known
    target: Path | None = None  # the folder graded: frames of files in it are the learner's own

    def too_slow(self, test: TestOutcome) -> bool:
        """Passed here, but took longer than the grader allows: it earns nothing when graded, nor here."""
        limit = self.rule.grader_limit(test.nodeid) if self.rule is not None else None
        return test.graded and test.outcome == "passed" and limit is not None and test.duration > limit

    @property
    def earned(self) -> float:
        return sum(t.earned for t in self.tests if not self.too_slow(t))

    @property
    def possible(self) -> float:
        return sum(t.possible for t in self.tests)

    @property
    def all_passed(self) -> bool:
        return bool(self.tests) and all((t.outcome == "passed" and not self.too_slow(t)) or not t.graded
                                        for t in self.tests)

    def _status(self, test: TestOutcome) -> str:
        return "too slow" if self.too_slow(test) else test.status

    def message(self, test: TestOutcome) -> str:
        """The test's whole message, as the tables show it: a too slow pass or a stop at the time limit explained."""
        limit = self.rule.grader_limit(test.nodeid) if self.rule is not None else None
        if self.too_slow(test):
            return (f"passed in {test.duration:.1f} s; the grader allows about {limit:g} s: make it faster or it "
                    f"will lose its {plural(test.points, 'point', spec='g')}")
        stub = unwritten(test)
        if stub is not None:  # its first line says it all: every input fails a stub the same way
            return stub.message.removeprefix(f"{self.exercise}: ")
        text = (test.not_graded or test.message).removeprefix(f"{self.exercise}: ")  # the table says which
        if test.outcome == "failed" and _TIMEOUT.search(_first_line(text)) and self.rule is not None:
            allowed = f"the grader allows about {limit:g} s" if limit is not None else "no reference time is known"
            return (f"stopped after {self.rule.stop_after(test.nodeid):g} s ({allowed}): a loop that never ends, "
                    f"or code much slower than the reference solution")
        return text

    def rows(self, verbose: bool = False) -> list[tuple[str, str, str, str]]:
        """(test, result, points, message: its first line, or all of it if verbose); the cases of a parametrized
        test that all end the same way share one row, e.g. `test_ring [2, 3, 4]`, so a hint is not repeated. A test
        that stopped at an untouched stub has one message, whatever its inputs: 'f is not implemented yet (hint: ...)'
        (grading.results.unwritten, the grouping the grader's feedback uses too)."""
        groups: dict[tuple, list[TestOutcome]] = {}
        for t in self.tests:
            function, _, case = t.nodeid.split("::", 1)[-1].partition("[")
            message = self.message(t).strip() if verbose else _first_line(self.message(t))
            groups.setdefault((function, self._status(t), message), []).append(t)
        rows = []
        for (function, status, message), tests in groups.items():
            cases = [t.nodeid.partition("[")[2].rstrip("]") for t in tests]
            name = function + (f" [{', '.join(cases)}]" if any(cases) else "")
            mark = {"passed": "passed", "failed": "FAILED"}.get(status, status)
            earned = sum(t.earned for t in tests if not self.too_slow(t))
            points = "–" if status == "not graded" else f"{earned:g} / {sum(t.possible for t in tests):g}"
            rows.append((name, mark, points, message))
        return rows

    def summary(self) -> str:
        text = f"{self.exercise}: {self.earned:g} / {self.possible:g} points"
        slow = [t for t in self.tests if self.too_slow(t)]
        stopped = [t for t in self.tests if t.outcome == "failed" and _TIMEOUT.search(_first_line(t.message))]
        if (slow or stopped) and self.rule is not None:
            text += f"; {self.rule.note()}"
        return text

    def smallest_failing_inputs(self) -> list[tuple[str, str]]:
        """(test, input) for each failed test whose inputs Hypothesis drew: the smallest input it found that fails."""
        found = []
        for t in self.tests:
            stub = unwritten(t) is not None  # every input fails a stub: nothing to learn from one
            shown = smallest_failing_input(t.message) if t.outcome == "failed" and not stub else ""
            if shown:
                found.append((t.nodeid.split("::", 1)[-1], shown))
        return found

    def where_it_failed(self) -> list[tuple[list[str], str]]:
        """([tests], traceback) for each different error raised in the learner's own files: their frames only (file,
        line, code), and the exception; tests that failed the same way share one entry."""
        found: dict[str, list[str]] = {}
        for t in self.tests:
            shown = (_learner_traceback(t.message, self.target) if t.outcome == "failed" and unwritten(t) is None
                     else "")
            name = t.nodeid.split("::", 1)[-1].partition("[")[0]
            if shown and name not in found.setdefault(shown, []):
                found[shown].append(name)
        return [(names, shown) for shown, names in found.items()]

    def _shown_rows(self, verbose: bool = False) -> list[tuple[str, str, str, str, int]]:
        """rows() as the tables show them, (test, result, points, message, span), each message once: the rows with the
        same message (the tests that stopped at the same stub, say) come together, where the first of them is, and
        share its cell (span = how many rows share it, 0 for the rows after the first). So no cell has to point at
        another ("same as above" after two different messages could mean either)."""
        groups: list[list[tuple[str, str, str, str]]] = []
        where: dict[str, int] = {}
        for row in self.rows(verbose):
            message = row[3]
            if message and message in where:
                groups[where[message]].append(row)
                continue
            if message:
                where[message] = len(groups)
            groups.append([row])
        return [(*row, len(group) if k == 0 else 0) for group in groups for k, row in enumerate(group)]

    def format(self, width: int | None = None, verbose: bool = False) -> str:
        """The table as text, `width` characters wide at most (the terminal's by default); messages are wrapped,
        never cut (verbose: whole messages, not only their first line), then where the learner's code failed."""
        width = width or _text_width()
        rows = [(name, mark, points, "  〃" if span == 0 else message)
                for name, mark, points, message, span in self._shown_rows(verbose)]
        lines = [_wrapped_table(["test", "result", "points", "message"], rows, width), self.summary()]
        inputs = self.smallest_failing_inputs()
        if inputs:
            lines.append("smallest failing inputs (Hypothesis shrank them):")
            lines += [_wrap(f"{name}: {shown}", width, "  ", "      ") for name, shown in inputs]
        for names, shown in self.where_it_failed():
            lines.append(f"where your code failed ({_names(names)}):")
            # A frame (`File "...", line 26, in f`) and the code under it, with its caret, stay whole lines: a
            # path to copy or click, and a caret that points at the right column. The error's message wraps.
            lines += [f"  {line}" if _FRAME.match(line) or line[:1].isspace() else _wrap(line, width, "  ", "    ")
                      for line in shown.splitlines()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

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
            icon = "✔ " if mark == "passed" else "✘ " if mark == "FAILED" else "⏱ " if mark == "too slow" else ""
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
        where = "".join(
            f"<p style='margin:0.5em 0 0 0'>where your code failed ({html.escape(_names(names))}):</p>"
            f"<pre style='margin:0'>{html.escape(shown)}</pre>" for names, shown in self.where_it_failed())
        return (
            f"<b>{html.escape(self.summary())}</b>"
            "<table><tr><th style='text-align:left'>test</th><th style='text-align:left'>result</th><th>points</th>"
            f"<th style='text-align:left'>message</th></tr>{''.join(body)}</table>{where}"
        )


def _names(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 2 else f"{names[0]} and {len(names) - 1} other tests"


def _learner_traceback(message: str | None, target: Path | None) -> str:
    """The frames of a traceback in `message` that are in the learner's own files (those in `target`, or any
    exNN_*.py outside the course's library and tests), each with its code, and the exception; '' if none."""
    lines = (message or "").splitlines()
    course = (paths.ROOT / "course_lib", paths.TESTS)
    kept, last_frame_end = [], None
    i = 0
    while i < len(lines):
        match = _FRAME.match(lines[i])
        if not match:
            i += 1
            continue
        indent = len(match.group("indent"))
        block_end = i + 1
        while block_end < len(lines) and len(lines[block_end]) - len(lines[block_end].lstrip()) > indent:
            block_end += 1
        path = Path(match.group("path"))
        mine = (path.parent.resolve() == target.resolve()) if target is not None else (
            re.match(r"ex\d+", path.name) is not None and not any(path.is_relative_to(c) for c in course))
        if mine:
            shown = _shown_path(path)
            where = f'File "{shown}", line {match.group("line")}'
            where += f", in {match.group('function')}" if match.group("function") else ""
            kept.append(where)
            kept += [line[indent:] for line in lines[i + 1:block_end]]
        last_frame_end = block_end
        i = block_end
    if not kept:
        return ""
    exception = lines[last_frame_end] if last_frame_end < len(lines) else ""
    return "\n".join(kept + ([exception.strip()] if exception.strip() else []))


def _shown_path(path: Path) -> str:
    """exercises/ex01_devices.py for a file of the course, else the path as it is."""
    try:
        return str(path.resolve().relative_to(paths.ROOT))
    except ValueError:
        return str(path)


def _text_width() -> int:
    """The terminal's width; a notebook's output area in a notebook (where the kernel's own stdout may be a wide
    terminal that the notebook is not)."""
    if "ipykernel" in sys.modules:
        return NOTEBOOK_WIDTH
    return max(40, shutil.get_terminal_size((NOTEBOOK_WIDTH, 24)).columns - 1)


def _wrap(text: str, width: int, first: str = "", rest: str = "") -> str:
    """`text` wrapped at spaces; a word longer than the line (a path) stays whole, to be copied or clicked."""
    return "\n".join(textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest,
                                   break_on_hyphens=False, break_long_words=False) or [first.rstrip()])


def _cell_lines(text: str, width: int) -> list[str]:
    """A cell's text in lines of at most `width`: each line of it wrapped, keeping its indentation."""
    lines = []
    for line in text.splitlines() or [""]:
        indent = " " * min(len(line) - len(line.lstrip()), width // 2)
        lines += textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False,
                               replace_whitespace=False) or [""]
    return lines


def _wrapped_table(header: list[str], rows: list[tuple[str, ...]], width: int) -> str:
    """An aligned table of at most `width` characters a line: the last column, then the first, wrap."""
    cells = [list(header)] + [list(row) for row in rows]
    widths = [max(len(line) for row in cells for line in row[i].splitlines() or [""]) for i in range(len(header))]
    gap = 2
    widths[0] = min(widths[0], max(len(header[0]), 16, width - sum(widths[1:3]) - 3 * gap - 30))
    widths[3] = max(len(header[3]), 20, width - sum(widths[:3]) - 3 * gap)
    out = []
    for n, row in enumerate(cells):
        wrapped = [_cell_lines(cell, w) for cell, w in zip(row, widths)]
        for k in range(max(len(c) for c in wrapped)):
            parts = [(c[k] if k < len(c) else "") for c in wrapped]
            parts[2] = parts[2].rjust(widths[2])  # points
            out.append((" " * gap).join(p.ljust(w) for p, w in zip(parts, widths)).rstrip())
        if n == 0:
            out.append((" " * gap).join("-" * w for w in widths))
    return "\n".join(out)


# older and newer Hypothesis; "explicit" where the input was one of the test's own @example(...)s
_HYPOTHESIS_MARKERS = ("Falsifying example: ", "Failing test case: ", "Falsifying explicit example: ",
                       "Failing explicit example: ")
INPUT_SHOWN = 300  # characters of a shrunk input shown in the table; a tensor's repr can be long


def smallest_failing_input(message: str | None) -> str:
    """The arguments of Hypothesis's shrunk failing case in a test's message, on one line ('' if there is none).

    Hypothesis adds "Failing test case: test_x(\n    xs=[100],\n)" to the failure; the table shows "xs=[100]". (Where
    one of the test's own examples failed first it says "Failing explicit example", and that one is shown.)
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


# ------------------------------------------------------------------------------------------------ progress


class Progress:
    """What check shows while the tests run; this one shows nothing (tests record what it is told)."""

    def collected(self, count: int) -> None: ...

    def started(self, nodeid: str, limit: float) -> None: ...

    def running(self, nodeid: str, seconds: float, limit: float) -> None:
        """Called about twice a second while a test runs: `seconds` so far, and where check stops it."""

    def finished(self, test: TestOutcome, so_far: CheckResult) -> None: ...

    def close(self) -> None: ...


def _short_name(nodeid: str) -> str:
    return nodeid.split("::", 1)[-1]


class BarProgress(Progress):
    """A tqdm.auto bar of tests done (a widget in a notebook) that says which test runs, for how long and its limit;
    in a terminal a line per finished test, in a notebook the table, filled in as tests finish."""

    def __init__(self, exercise: str, notebook: bool):
        from tqdm.auto import tqdm

        self.exercise, self.notebook, self.handle, self.told = exercise, notebook, None, set()
        # In a terminal, no bar where stderr is not one (a log, a pipe): a line per test, and one for a long wait.
        self.bar = tqdm(total=None, desc=f"{exercise}: starting", unit=" tests", leave=False, dynamic_ncols=True,
                        disable=False if notebook else None)
        if self.bar.disable:
            self.bar.write(f"{exercise}: starting the tests (the first takes a few seconds)")

    def collected(self, count: int) -> None:
        self.bar.total = count
        self.bar.set_description(self.exercise)

    def running(self, nodeid: str, seconds: float, limit: float) -> None:
        waiting = f"{_short_name(nodeid)}: running for {seconds:.0f} s (its limit is {limit:g} s)"
        if not self.bar.disable:
            self.bar.set_postfix_str(waiting if seconds >= 1 else "")
        elif seconds >= LONG_WAIT and nodeid not in self.told:
            self.told.add(nodeid)
            self.bar.write(waiting)

    def finished(self, test: TestOutcome, so_far: CheckResult) -> None:
        self.bar.update(1)
        self.bar.set_postfix_str("")
        if self.notebook:
            from IPython.display import display

            if self.handle is None:
                self.handle = display(so_far, display_id=True)
            else:
                self.handle.update(so_far)
            return
        status = so_far._status(test)
        mark = {"passed": "✔ passed", "failed": "✘ FAILED"}.get(status, status)
        self.bar.write(f"{mark:<10} {_short_name(test.nodeid)} ({test.duration:.1f} s)")

    def show(self, result: CheckResult) -> None:
        """The final table: in the notebook, in place of the one filled in as tests finished."""
        if self.handle is not None:
            self.handle.update(result)
        else:
            _show(result)

    def close(self) -> None:
        self.bar.close()


# ------------------------------------------------------------------------------------------------ running pytest


def check(exercise: str, target: str = "exercises", timeout: float = 600.0) -> None:
    """Run the graded tests of `exercise` (e.g. "ex01") against your files and show a table of points (notebook 00)."""
    progress = BarProgress(exercise, notebook=_in_notebook())
    progress.show(run_check(exercise, target, timeout, progress=progress))


def _test_files(exercise: str) -> list[Path]:
    tests = sorted(paths.TESTS.glob(f"test_{exercise}_*.py"))
    if not tests:
        raise ValueError(f"no tests for {exercise!r}; exercises with tests: {', '.join(known_exercises()) or 'none'}")
    return tests


def known_exercises() -> list[str]:
    """The exercises that have graded tests: ex00, ex01, ..."""
    return sorted({p.name.split("_")[1] for p in paths.TESTS.glob("test_ex*_*.py")})


def run_check(exercise: str, target: str = "exercises", timeout: float = 600.0, *, progress: Progress | None = None,
              reference_times: str | os.PathLike | None = REFERENCE_TIMES, select: str | None = None) -> CheckResult:
    """Run the graded tests of `exercise` against `target` and return the result without showing it (notebook 00).

    select: a pytest -k expression, to run only some of the tests.
    """
    tests = _test_files(exercise)
    rule = TimeRule.load(reference_times)
    limits = {nodeid: rule.stop_after(nodeid) for nodeid in rule.reference}
    after_a_loop = {nodeid: round(min(rule.ceiling, GRACE * seconds), 1) for nodeid, seconds in
                    time_rule.limits_after_a_loop(rule.reference, rule.factor, rule.ceiling).items()}
    folder = paths.ROOT / target if target in {"exercises", "solutions"} else Path(target).resolve()
    report, output = _run_pytest(tests, target, limits, rule.ceiling, timeout, progress or Progress(),
                                 lambda done: CheckResult(exercise, done, rule=rule, target=folder), select,
                                 after_a_loop)
    if report is None or (not report.tests and report.exitstatus is None):
        raise RuntimeError(f"pytest did not report any result for {exercise}; its output:\n{output[-3000:]}")
    return CheckResult(exercise, list(report.tests.values()), output, rule, folder)


def _run_pytest(tests: list[Path], target: str, limits: dict[str, float], ceiling: float, timeout: float,
                progress: Progress, result_of, select: str | None = None, after_a_loop: dict[str, float] | None = None):
    """Run pytest on `tests` with these limits (and `after_a_loop`, the limits once a test of the exercise ran out
    of time: grading.loops), telling `progress` as tests start and finish; (report, output)."""
    with tempfile.TemporaryDirectory() as scratch:
        report_path, limits_path = Path(scratch) / "report.jsonl", Path(scratch) / "limits.json"
        limits_path.write_text(json.dumps({**limits, **({time_rule.AFTER_A_LOOP: after_a_loop} if after_a_loop else {})}))
        command = [sys.executable, "-m", "pytest", *map(str, tests), "--target", str(target), "-q",
                   "--course-report", str(report_path), "-p", "no:cacheprovider",
                   "--test-timeouts", str(limits_path), "--timeout", f"{ceiling:g}"]
        if select:
            command += ["-k", select]
        with open(Path(scratch) / "output.txt", "w+", encoding="utf-8", errors="replace") as log:
            # A session of its own: its ranks too are stopped with it. It dies with this process, even SIGKILLed
            # (a kernel that JupyterLab kills while check runs in it).
            process = subprocess.Popen(command, cwd=paths.ROOT, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, env={**os.environ, **stopping.dies_with_me()})
            note = ""
            try:
                note = _follow(process, report_path, limits, ceiling, timeout, progress, result_of)
            finally:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                progress.close()
            log.seek(0)
            output = log.read() + note
        return read_report(report_path), output


def _follow(process, report_path: Path, limits: dict[str, float], ceiling: float, timeout: float,
            progress: Progress, result_of) -> str:
    """Read the report's lines as the plugin appends them, until pytest ends; '' or why it was stopped."""
    deadline = time.monotonic() + timeout
    offset, pending, done = 0, "", []
    running, since = None, 0.0
    while True:
        ended = process.poll() is not None
        try:
            with open(report_path, encoding="utf-8") as stream:
                stream.seek(offset)
                chunk = stream.read()
                offset = stream.tell()
        except OSError:
            chunk = ""
        pending += chunk
        *lines, pending = pending.split("\n")
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "collected" in record:
                progress.collected(len(record["collected"]))
            elif "started" in record:
                running, since = record["started"], time.monotonic()
                progress.started(running, limits.get(running, ceiling))
            elif "test" in record:
                done.append(TestOutcome.from_dict(record["test"]))
                running = None
                progress.finished(done[-1], result_of(list(done)))
        if ended:
            return ""
        if time.monotonic() > deadline:
            return f"\nthe tests did not finish within {timeout:g} s and were stopped"
        if running is not None:
            progress.running(running, time.monotonic() - since, limits.get(running, ceiling))
        time.sleep(0.5)


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def _show(result: CheckResult) -> None:
    if _in_notebook():
        from IPython.display import display

        display(result)
        return
    print(result)


# ------------------------------------------------------------------------------------------------ reference times


def record_reference_times(exercises: list[str] | None = None, path: str | os.PathLike = REFERENCE_TIMES) -> dict:
    """(course developers) Grade solutions/ as check does and write each graded test's time to `path`.

    Run it on the course's CI machine after changing a test or a solution; the times of other exercises in the
    file are kept. Every graded test of the solutions must pass.
    """
    import platform
    from datetime import date

    if not paths.SOLUTIONS.is_dir():
        raise SystemExit("no solutions/ here: the reference times are recorded from the reference solutions")
    tests = [f for exercise in (exercises or known_exercises()) for f in _test_files(exercise)]
    rule = TimeRule.load(None)
    report, output = _run_pytest(tests, "solutions", {}, rule.ceiling, 3600.0, Progress(), lambda done: None)
    graded = [t for t in (report.tests.values() if report else []) if t.points is not None]
    failed = [t.nodeid for t in graded if t.outcome not in ("passed", "skipped")]
    if failed or not graded:
        raise SystemExit(f"the reference solutions must pass every graded test (failed: {failed or 'all'}); "
                         f"pytest's output ends with:\n{output[-3000:]}")
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        data = {}
    durations = {k: v for k, v in data.get("durations", {}).items()
                 if not any(f"test_{e}_" in k for e in exercises or known_exercises())}
    durations.update({t.nodeid: t.duration for t in graded if t.outcome == "passed"})
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = "?"
    data = {"about": "each graded test's time with the reference solutions, for check's time limits; written by "
                     "python3 course.py check --record-reference-times",
            "measured_on": f"{plural(os.cpu_count() or 1, 'core')}, {platform.machine()}, "
                           f"Python {platform.python_version()}, torch {torch_version}, {date.today().isoformat()}",
            "durations": dict(sorted(durations.items()))}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")
    return data


# ------------------------------------------------------------------------------------------------ command line


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python3 course.py check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exercise", nargs="?", help="the exercise to check, e.g. ex01")
    parser.add_argument("--target", default="exercises",
                        help="what to check: exercises (default), solutions, or a folder of exNN_*.py files")
    parser.add_argument("-v", "--verbose", action="store_true", help="whole messages, not only their first line")
    parser.add_argument("-k", dest="select", metavar="EXPRESSION",
                        help="only the tests whose names match, as pytest's -k (e.g. -k ring)")
    parser.add_argument("--reference-times", default=str(REFERENCE_TIMES), metavar="FILE",
                        help="the reference solutions' time of each test (default: tests/reference_times.json)")
    parser.add_argument("--record-reference-times", action="store_true",
                        help="(course developers) grade solutions/ and write each test's time to --reference-times")
    options = parser.parse_args(argv)
    known = known_exercises()
    if options.exercise is not None and options.exercise not in known:
        parser.error(f"no exercise {options.exercise!r}; the exercises are {', '.join(known) or 'none'}")
    if options.record_reference_times:
        data = record_reference_times([options.exercise] if options.exercise else None, options.reference_times)
        print(f"{plural(len(data['durations']), 'reference time')} written to {options.reference_times}")
        return 0
    if options.exercise is None:
        parser.error(f"say which exercise to check: {', '.join(known) or 'none'}")
    progress = BarProgress(options.exercise, notebook=False)
    stopping.stop_like_ctrl_c()  # SIGTERM too stops the tests and every process they started
    try:
        result = run_check(options.exercise, options.target, progress=progress,
                           reference_times=options.reference_times, select=options.select)
    except KeyboardInterrupt:
        print(f"\n{options.exercise}: stopped; the tests did not finish", file=sys.stderr)
        return 130
    print(result.format(verbose=options.verbose))
    return 0 if result.all_passed else 1


if __name__ == "__main__":
    sys.exit(main())
