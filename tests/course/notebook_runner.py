"""Execute a notebook in a fresh Jupyter kernel and collect what it printed (used by the notebook tests)."""

from __future__ import annotations

import time
from pathlib import Path

import nbclient
import nbformat


def execute(notebook: nbformat.NotebookNode, cwd: Path, cell_timeout: float = 120) -> float:
    """Run every cell in place; return the seconds it took. Raises CellExecutionError on an error."""
    start = time.monotonic()
    client = nbclient.NotebookClient(
        notebook, timeout=cell_timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    # No widget models kept here (the browser tests look at the widgets): with them, nbclient sometimes waits out
    # the cell timeout after an ipywidgets `interactive` that prints or plots (jupyter/nbclient#312), then goes on.
    client.widget_registry = {}
    client.execute()
    return time.monotonic() - start


def problems(notebook: nbformat.NotebookNode) -> list[str]:
    """Every error output and every stderr stream, with the cell it came from."""
    found = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                found.append(f"cell {index}: {output['ename']}: {output['evalue']}")
            elif output.get("output_type") == "stream" and output.get("name") == "stderr":
                found.append(f"cell {index} wrote to stderr: {output['text'][:500]}")
    return found


def text_of(cell) -> str:
    """All stdout text and plain-text results of one executed cell."""
    parts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            parts.append(output["text"])
        elif "data" in output and "text/plain" in output["data"]:
            parts.append(output["data"]["text/plain"])
    return "".join(parts)
