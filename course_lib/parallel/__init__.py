"""The reusable parts of lessons 02–09: streams (02), then one module per parallelism, and the planner (09).

Lessons put here what a later lesson, a test or a benchmark reuses (a by-hand DataParallel, pipeline
schedules, tensor-parallel layers, memory and performance calculators), never an exercise's solution.
"""

import math
import numbers
import operator


def whole_number(n, what: str, minimum: int = 1, *, integral_floats: bool = True) -> int:
    """n as an int, or a TypeError (not a whole number) or a ValueError (below `minimum`) that names the argument: the
    check pipeline/, tensor_parallel.py and sharding.py share.

    The course's rule for counts: an int (numpy's integers too) or an integral float such as 7.5e9 (how the ZeRO
    paper types Ψ), converted with int(); a bool, a fractional float, nan, inf or anything else is refused.
    A label rather than a count (a device or stage index, a layer boundary: `integral_floats=False`) must be an int:
    2.0 there is more likely a mix-up than a number typed as the paper types it."""
    if isinstance(n, bool) or not isinstance(n, numbers.Real) or not (integral_floats or isinstance(n, numbers.Integral)):
        kinds = "an int, or an integral float such as 7.5e9" if integral_floats else "an int: it is an index"
        raise TypeError(f"{what} must be a whole number ({kinds}), not {type(n).__name__} {n!r}")
    if isinstance(n, numbers.Integral):
        n = operator.index(n)
    elif integral_floats and math.isfinite(n) and float(n).is_integer():
        n = int(n)
    else:
        raise TypeError(f"{what} must be a whole number (an int, or an integral float such as 7.5e9), not "
                        f"{type(n).__name__} {n!r}")
    if n < minimum:
        raise ValueError(f"{what} must be {minimum} or more, not {n}")
    return n
