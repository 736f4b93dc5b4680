"""Keep what GPU cells printed on a real GPU, for learners without one (the instructor's tool, notebook 01).

    python -m course_lib.instructor.record_gpu_outputs EXECUTED.ipynb [...]

Reads notebooks executed on a GPU machine (for example the ones `../shared/gpu/run.sh` brings back), finds
each cell that calls `require_gpus(..., record="KEY")` and ran on the GPU (its output holds the line
`measured on DEVICE · torch VERSION · DATE`), and stores what it printed after that line under KEY in
notebooks/recorded_on_gpu.json, with the device, torch version and date. Cells that were skipped, or that
wrote an error, are left out and said so.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from course_lib.recorded import MEASURED, RECORDS, load_records

RECORD_CALL = re.compile(r"require_gpus\([^)]*record=[\"']([^\"']+)[\"']")
MAX_TEXT = 20_000  # characters kept per cell


def cell_text(cell: dict) -> tuple[str, bool]:
    """A code cell's printed text (stdout and plain-text results), and whether it wrote an error."""
    parts, failed = [], False
    for output in cell.get("outputs", []):
        kind = output.get("output_type")
        if kind == "error" or (kind == "stream" and output.get("name") == "stderr"):
            failed = True
        elif kind == "stream":
            parts.append("".join(output.get("text", "")))
        elif "application/vnd.jupyter.widget-view+json" in output.get("data", {}):
            continue  # a progress bar or a control: its text is a snapshot of a widget, not a result
        elif kind in ("execute_result", "display_data") and "text/plain" in output.get("data", {}):
            text = "".join(output["data"]["text/plain"])
            if not text.startswith("<Figure"):
                parts.append(text + "\n")
    return "".join(parts), failed


def records_from(path: Path) -> tuple[dict[str, dict], list[str]]:
    """The records one executed notebook yields, and a line for each GPU cell that yields none."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    found, skipped = {}, []
    for cell in notebook.get("cells", []):
        source = "".join(cell.get("source", ""))
        match = RECORD_CALL.search(source) if cell.get("cell_type") == "code" else None
        if not match:
            continue
        key = match.group(1)
        text, failed = cell_text(cell)
        lines = text.splitlines(keepends=True)
        start = next((i for i, line in enumerate(lines) if MEASURED.match(line.strip())), None)
        measured = MEASURED.match(lines[start].strip()) if start is not None else None
        rest = "".join(lines[start + 1:]) if start is not None else ""
        if failed or not measured:
            skipped.append(f"{key}: {'wrote an error' if failed else 'did not run on a GPU'} in {path.name}")
            continue
        found[key] = {**measured.groupdict(), "text": rest[:MAX_TEXT], "notebook": path.name}
    return found, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.instructor.record_gpu_outputs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path, help="notebooks executed on a GPU machine")
    options = parser.parse_args(argv)
    records = load_records()
    for path in options.notebooks:
        found, skipped = records_from(path)
        records.update(found)
        for key in sorted(found):
            print(f"recorded {key} ({found[key]['device']}, torch {found[key]['torch']}, {found[key]['date']})")
        for line in skipped:
            print(f"not recorded: {line}")
    RECORDS.write_text(json.dumps(dict(sorted(records.items())), indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
