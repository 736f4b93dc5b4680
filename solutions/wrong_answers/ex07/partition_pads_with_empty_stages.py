"""Binary search with a greedy packing that may use fewer stages, padded with empty ones to make up the count."""

LOSES = ["test_partition_minimises_the_costliest_stage", "test_partition_returns_contiguous_stages"]


def partition(costs, stages):
    costs = list(costs)
    if not costs or isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= len(costs):
        raise ValueError(f"stages is {stages!r}: pass 1 to len(costs); costs must not be empty")
    if any(isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c < 0 for c in costs):
        raise ValueError("costs: pass finite numbers, 0 or more")

    def pack(limit):
        groups, current, total = [], [], 0.0
        for i, cost in enumerate(costs):
            if current and total + cost > limit:
                groups.append(current)
                current, total = [], 0.0
            current.append(i)
            total += cost
        return groups + [current]

    low, high = max(costs), sum(costs)
    for _ in range(100):
        middle = (low + high) / 2
        if len(pack(middle)) <= stages:
            high = middle
        else:
            low = middle
    groups = pack(high)
    return groups + [[] for _ in range(stages - len(groups))]
