"""What a failed test's message tells the learner beyond its first line (notebook 00): where their own code failed
(the frames of the traceback that are in their files) and the smallest input Hypothesis found that fails.

`check`'s result (course_lib/check_result.py) reads both from each test's message; its two displays
(course_lib/check_display.py) show them under the table.
"""

from __future__ import annotations

import re
from pathlib import Path

from course_lib import paths

__all__ = ["FRAME", "learner_traceback", "smallest_failing_input", "INPUT_SHOWN"]

# A frame of a traceback: `File "...", line 26, in f` (indented as the traceback has it)
FRAME = re.compile(r'^(?P<indent>\s*)File "(?P<path>[^"]+)", line (?P<line>\d+)(?:, in (?P<function>.+))?$')


def learner_traceback(message: str | None, target: Path | None) -> str:
    """The frames of a traceback in `message` that are in the learner's own files (those in `target`, or any
    exNN_*.py outside the course's library and tests), each with its code, and the exception; '' if none."""
    lines = (message or "").splitlines()
    course = (paths.ROOT / "course_lib", paths.TESTS)
    kept, last_frame_end = [], None
    i = 0
    while i < len(lines):
        match = FRAME.match(lines[i])
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
