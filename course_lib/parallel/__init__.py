"""The reusable parts of lessons 02–08: streams (02), then one module per parallelism.

Lessons put here what a later lesson, a test or a benchmark reuses (a by-hand DataParallel, pipeline
schedules, tensor-parallel layers, memory and performance calculators), never an exercise's solution.
"""

import numbers
import operator


def whole_number(n, what: str, minimum: int = 1) -> int:
    """n as an int, or a TypeError (not a whole number; bool is not one) or a ValueError (below `minimum`) that names
    the argument: the check pipeline.py, tensor_parallel.py and sharding.py share."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{what} must be a whole number, not {type(n).__name__} {n!r}")
    n = operator.index(n)
    if n < minimum:
        raise ValueError(f"{what} must be {minimum} or more, not {n}")
    return n
