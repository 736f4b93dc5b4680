"""Small aligned tables of results, printed in a notebook cell or a terminal (notebook 01 introduces them)."""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["print_table", "format_table"]


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Rows under a header as an aligned plain-text table; numbers are right-aligned (notebook 01)."""
    cells = [[str(h) for h in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(cells[0], widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    for row in cells[1:]:
        lines.append("  ".join(c.rjust(w) if _numeric(c) else c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def print_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print rows under a header as an aligned plain-text table (notebook 01)."""
    print(format_table(header, rows))


def _numeric(text: str) -> bool:
    return bool(text) and (text[0].isdigit() or text[0] in "-+.") and any(ch.isdigit() for ch in text)
