"""The dynamic programme on the costs as given: near the largest float the prefix sums reach inf, and a stage is empty."""

LOSES = ["test_partition_handles_costs_near_the_float_maximum"]


def partition(costs, stages):
    if not isinstance(costs, (list, tuple)) or not costs:
        raise ValueError(f"costs is {costs!r}: pass a non-empty list (or tuple) of the layers' costs")
    for i, cost in enumerate(costs):
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0:
            raise ValueError(f"costs[{i}] is {cost!r}: pass each layer's cost as a finite number, 0 or more")
    n = len(costs)
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= n:
        raise ValueError(f"stages is {stages!r}: pass a whole number of stages from 1 to len(costs) = {n}")
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)  # 1e308 + 1e308 is inf
    best = [[math.inf] * (n + 1) for _ in range(stages + 1)]
    start = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                largest = max(best[k - 1][j], prefix[i] - prefix[j])
                if largest < best[k][i]:  # never true once every candidate is inf (or nan)
                    best[k][i], start[k][i] = largest, j
    groups, end = [], n
    for k in range(stages, 0, -1):
        groups.append(list(range(start[k][end], end)))
        end = start[k][end]
    return groups[::-1]
