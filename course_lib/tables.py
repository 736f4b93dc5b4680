"""Small aligned tables of results, printed in a notebook cell or a terminal (notebook 01 introduces them)."""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["print_table", "format_table", "plural"]


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


def plural(n: float, noun: str, many: str | None = None, *, number: bool = True, spec: str = "") -> str:
    """A count and its noun, singular only for 1: plural(1, "rank") is "1 rank", plural(2, "batch") "2 batches" (notebook 01).

    `many` spells an irregular plural (plural(2, "child", "children")); in a phrase ("CUDA GPU") the last word
    takes the plural. number=False gives the noun alone ("Rank" or "Ranks"); `spec` formats the count
    (spec="," gives "1,234 samples"). Units ("1 s", "2 ms") are not nouns: write those without it.
    """
    word = noun if n == 1 else many or _plural_of(noun)
    return f"{format(n, spec)} {word}" if number else word


def _plural_of(noun: str) -> str:
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1].lower() not in ("", "a", "e", "i", "o", "u"):
        return noun[:-1] + "ies"
    return noun + "s"


def _numeric(text: str) -> bool:
    return bool(text) and (text[0].isdigit() or text[0] in "-+.") and any(ch.isdigit() for ch in text)
