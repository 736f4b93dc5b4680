"""Argument checks the precision modules share: real numbers, finite numbers, counts and seeds (notebook 06)."""

from __future__ import annotations

import math
import numbers
import operator


def _real(x) -> bool:
    """A real number (numpy's too), not a bool; may be inf or NaN."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _finite(x) -> bool:
    return _real(x) and math.isfinite(x)


def _count(n, what: str) -> int:
    """n as an int: the course's rule for counts, an int (numpy's too) or an integral float such as 1000.0 (used as
    int(1000.0)); a bool, a fractional float, nan, inf or anything else is a TypeError."""
    if isinstance(n, bool):
        raise TypeError(f"{what} must be a whole number (an int, or an integral float such as 1000.0), not {n!r}")
    if isinstance(n, float) and math.isfinite(n) and n.is_integer():
        return int(n)
    try:
        return operator.index(n)
    except TypeError:
        raise TypeError(f"{what} must be a whole number (an int, or an integral float such as 1000.0), "
                        f"not {n!r}") from None


def _seed(seed) -> int:
    seed = _count(seed, "seed")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, not {seed}")
    return seed
