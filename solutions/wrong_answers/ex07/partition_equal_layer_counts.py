"""Gives every stage the same number of layers, whatever they cost."""

LOSES = ["test_partition_minimises_the_costliest_stage"]


def partition(costs, stages):
    n = len(costs)
    if not costs or isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= n:
        raise ValueError(f"stages is {stages!r}: pass 1 to len(costs); costs must not be empty")
    if any(isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c < 0 for c in costs):
        raise ValueError("costs: pass finite numbers, 0 or more")
    base, extra = divmod(n, stages)
    groups, first = [], 0
    for s in range(stages):
        size = base + (1 if s < extra else 0)
        groups.append(list(range(first, first + size)))
        first += size
    return groups
