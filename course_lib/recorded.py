"""What a GPU cell printed on a real GPU, kept for learners without one, and always labelled as recorded (notebook 01).

A cell that needs a GPU starts with `if require_gpus(1, "what it does", record="01/pinned_copies"):`.
On a GPU machine the cell runs, and its first line says where it was measured:

    measured on NVIDIA H100 80GB HBM3 · torch 2.11.0+cu130 · 2026-11-23

On a machine without one, the cell is skipped and shows what it printed on a GPU, from
`notebooks/recorded_on_gpu.json`, under a header that says so. Nothing recorded is ever shown as the
learner's own measurement: what a live cell says of itself ("measured here (ms)", "here: copy at 55.2 GB/s")
is true where it runs, so a record is shown with those words relabelled ("recorded (ms)", "recorded: copy at
55.2 GB/s"), the numbers and the table's columns unchanged (`as_recorded`). After executing the notebooks on a GPU, an instructor refreshes the records
with `python -m course_lib.instructor.record_gpu_outputs EXECUTED.ipynb ...`.
"""

from __future__ import annotations

import datetime
import json
import re
import textwrap

from course_lib.paths import NOTEBOOKS

__all__ = ["RECORDS", "measured_here", "show_recorded", "load_records", "as_recorded", "MEASURED"]

RECORDS = NOTEBOOKS / "recorded_on_gpu.json"
WIDTH = 100  # characters per printed line: a notebook breaks longer ones mid-word
MEASURED = re.compile(r"^measured on (?P<device>.+?) · torch (?P<torch>\S+) · (?P<date>\d{4}-\d{2}-\d{2})$")
# What a live GPU cell may say about itself, and what a record of it says instead: "here" is the GPU that ran it,
# not the machine that shows the record. The last rule catches any other "here"; "there" is no longer than it.
RELABEL = [
    (re.compile(r"\b(M|m)easured here\b"), lambda m: "Recorded" if m.group(1) == "M" else "recorded"),
    (re.compile(r"\bMEASURED here\b"), "RECORDED"),
    (re.compile(r"^here:"), "recorded:"),
    (re.compile(r"^Here\b,?"), "In this record,"),
    (re.compile(r"\bthis machine\b"), "the recording machine"),
    (re.compile(r"\bhere\b"), "there"),
    (re.compile(r"\bHere\b"), "There"),
]
DASHES = re.compile(r"^-+(?:  -+)*$")  # the line under a table's header (course_lib.tables.format_table)


def load_records() -> dict[str, dict]:
    """Every record: key -> {device, torch, date, text, note}."""
    try:
        return json.loads(RECORDS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def measured_here() -> str:
    """The line a GPU cell prints first: which GPU, which torch, which day (notebook 01)."""
    import torch

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return f"measured on {name} · torch {torch.__version__} · {datetime.date.today().isoformat()}"


def show_recorded(key: str) -> bool:
    """Print what the cell `key` printed on a real GPU, labelled as recorded; False if there is no record (notebook 01)."""
    record = load_records().get(key)
    if not record:
        print(f"(No GPU run of this cell has been recorded yet: {key}.)")
        return False
    print(textwrap.fill(f"Recorded on {record['device']} with torch {record['torch']} on {record['date']}, "
                        "not on this machine:", WIDTH))
    if record.get("note"):
        print(textwrap.fill(f"({as_recorded(record['note'])})", WIDTH))
    lines = []
    for line in as_recorded(record["text"].rstrip()).splitlines():  # a long line is folded at a space, never mid-word
        lines += textwrap.wrap(line, WIDTH - 2, subsequent_indent="  ", break_long_words=False,
                               break_on_hyphens=False) if len(line) > WIDTH - 2 else [line]
    print(textwrap.indent("\n".join(lines), "│ ", lambda line: True))
    return True


def as_recorded(text: str) -> str:
    """`text`, printed by a live GPU cell, as a record of it says it: "measured here" becomes "recorded" (notebook 01).

    Only words change. In a table (a header over a line of dashes) each cell is relabelled within its column,
    so every column, and every number in it, stays where it was.
    """
    lines = text.split("\n")
    columns: list[tuple[int, int]] | None = None  # the current table's column spans
    for i, line in enumerate(lines):
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if DASHES.match(following):
            columns = [m.span() for m in re.finditer(r"-+", following)]
        elif DASHES.match(line):
            continue
        elif columns and not _fits(line, columns):
            columns = None
        lines[i] = _relabel_cells(line, columns) if columns else _relabel(line)
    return "\n".join(lines)


def _relabel(words: str) -> str:
    for pattern, replacement in RELABEL:
        words = pattern.sub(replacement, words)
    return words


def _fits(line: str, columns: list[tuple[int, int]]) -> bool:
    """True if `line` is a row of the table whose columns these are: nothing in the gaps, nothing past the end."""
    return len(line) <= columns[-1][1] and all(line[end:start].strip() == ""
                                               for (_, end), (start, _) in zip(columns, columns[1:]))


def _relabel_cells(line: str, columns: list[tuple[int, int]]) -> str:
    cells = []
    for start, end in columns:
        raw = line[start:end].ljust(end - start)
        new = _relabel(raw.strip())
        if new == raw.strip():
            cells.append(raw)
        else:  # a right-aligned number column keeps its alignment; a label column is left-aligned
            cells.append(new.rjust(end - start) if raw.startswith(" ") and raw.strip() else new.ljust(end - start))
    return "  ".join(cells).rstrip()
