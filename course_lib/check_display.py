"""The two displays of `check`'s result (notebook 00): the table as text (a terminal, `print(result)`) and as
HTML (a notebook), and what shows while the tests run (a bar of tests done, or a line per test in a log).

Both tables show the rows of course_lib/check_result.py (the tests that stopped at the same stub share one
message cell, so each stub's hint shows once), then where the learner's code failed and the smallest failing
inputs (course_lib/check_failures.py).
"""

from __future__ import annotations

import html
import shutil
import sys
import textwrap
from typing import TYPE_CHECKING

from course_lib.check_failures import FRAME
from course_lib.grading.results import TestOutcome
from course_lib.tables import plural

if TYPE_CHECKING:
    from course_lib.check_result import CheckResult

__all__ = ["text_table", "html_table", "Progress", "BarProgress", "show_result", "in_notebook", "NOTEBOOK_WIDTH"]

LONG_WAIT = 10  # seconds: without a bar (a log), a test that runs this long says so, and what its limit is
NOTEBOOK_WIDTH = 100  # characters: a notebook's output area breaks longer lines mid-word


# ------------------------------------------------------------------------------------------------ the text table


def text_table(result: CheckResult, width: int | None = None, verbose: bool = False) -> str:
    """The table as text, `width` characters wide at most (the terminal's by default); messages are wrapped,
    never cut (verbose: whole messages, not only their first line), then where the learner's code failed."""
    width = width or _text_width()
    rows = [(name, mark, points, "  〃" if span == 0 else message)
            for name, mark, points, message, span in result._shown_rows(verbose)]
    lines = [_wrapped_table(["test", "result", "points", "message"], rows, width), result.summary()]
    inputs = result.smallest_failing_inputs()
    if inputs:
        lines.append("smallest failing inputs (Hypothesis shrank them):")
        lines += [_wrap(f"{name}: {shown}", width, "  ", "      ") for name, shown in inputs]
    for names, shown in result.where_it_failed():
        lines.append(f"where your code failed ({_names(names)}):")
        # A frame (`File "...", line 26, in f`) and the code under it, with its caret, stay whole lines: a
        # path to copy or click, and a caret that points at the right column. The error's message wraps.
        lines += [f"  {line}" if FRAME.match(line) or line[:1].isspace() else _wrap(line, width, "  ", "    ")
                  for line in shown.splitlines()]
    return "\n".join(lines)


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


def _names(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 2 else f"{names[0]} and {plural(len(names) - 1, 'other test')}"


# ------------------------------------------------------------------------------------------------ the HTML table


def html_table(result: CheckResult) -> str:
    """The table as HTML, for a notebook: each shared message in one cell, then where the learner's code failed."""
    colour = {"passed": "#1a7f37", "FAILED": "#cf222e", "not graded": "#6e7781"}
    # "✘ FAILED", "0 / 6" and a test's name never break over two lines (JupyterLab's <code> wraps by default)
    nowrap = "white-space:nowrap"
    # Rows that share a message share a shade too (JupyterLab's own stripes alternate row by row).
    shades = ["var(--jp-layout-color0, #fff)", "var(--jp-rendermime-table-row-background, #f5f5f5)"]
    body, group = [], -1
    inputs = dict(result.smallest_failing_inputs())
    for name, mark, points, message, span in result._shown_rows():
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
        f"<pre style='margin:0'>{html.escape(shown)}</pre>" for names, shown in result.where_it_failed())
    return (
        f"<b>{html.escape(result.summary())}</b>"
        "<table><tr><th style='text-align:left'>test</th><th style='text-align:left'>result</th><th>points</th>"
        f"<th style='text-align:left'>message</th></tr>{''.join(body)}</table>{where}"
    )


# ------------------------------------------------------------------------------------------------ while the tests run


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
            show_result(result)

    def close(self) -> None:
        self.bar.close()


def in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def show_result(result: CheckResult) -> None:
    if in_notebook():
        from IPython.display import display

        display(result)
        return
    print(result)

