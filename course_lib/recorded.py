"""What a GPU cell printed on a real GPU, kept for learners without one, and always labelled as recorded (notebook 01).

A cell that needs a GPU starts with `if require_gpus(1, "what it does", record="01/pinned_copies"):`.
On a GPU machine the cell runs, and its first line says where it was measured:

    measured on NVIDIA H100 80GB HBM3 · torch 2.11.0+cu130 · 2026-11-23

On a machine without one, the cell is skipped and shows what it printed on a GPU, from
`notebooks/recorded_on_gpu.json`, under a header that says so. Nothing recorded is ever shown as the
learner's own measurement. After executing the notebooks on a GPU, an instructor refreshes the records
with `python -m course_lib.instructor.record_gpu_outputs EXECUTED.ipynb ...`.
"""

from __future__ import annotations

import datetime
import json
import re
import textwrap

from course_lib.paths import NOTEBOOKS

__all__ = ["RECORDS", "measured_here", "show_recorded", "load_records", "MEASURED"]

RECORDS = NOTEBOOKS / "recorded_on_gpu.json"
WIDTH = 100  # characters per printed line: a notebook breaks longer ones mid-word
MEASURED = re.compile(r"^measured on (?P<device>.+?) · torch (?P<torch>\S+) · (?P<date>\d{4}-\d{2}-\d{2})$")


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
        print(textwrap.fill(f"({record['note']})", WIDTH))
    lines = []
    for line in record["text"].rstrip().splitlines():  # a long line is folded at a space, never mid-word
        lines += textwrap.wrap(line, WIDTH - 2, subsequent_indent="  ", break_long_words=False,
                               break_on_hyphens=False) if len(line) > WIDTH - 2 else [line]
    print(textwrap.indent("\n".join(lines), "│ ", lambda line: True))
    return True
