"""Fills each stage with layers until it reaches the average stage cost: a first fit, not the best split."""

LOSES = ["test_partition_minimises_the_costliest_stage"]


def partition(costs, stages):
    costs = list(costs)
    if not costs or isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= len(costs):
        raise ValueError(f"stages is {stages!r}: pass 1 to len(costs); costs must not be empty")
    if any(isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c < 0 for c in costs):
        raise ValueError("costs: pass finite numbers, 0 or more")
    target = sum(costs) / stages
    groups, current, total = [], [], 0.0
    for i, cost in enumerate(costs):
        left = len(costs) - i  # layers left, this one included
        need = stages - len(groups) - 1  # stages still to open after the current one
        if current and (total + cost > target or left <= need) and len(groups) < stages - 1:
            groups.append(current)
            current, total = [], 0.0
        current.append(i)
        total += cost
    groups.append(current)
    return groups
