"""Trusts its arguments: negative, NaN or infinite costs and impossible stage counts go through."""

LOSES = ["test_partition_rejects_bad_arguments"]


def partition(costs, stages):
    n = len(costs)
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    best = [[math.inf] * (n + 1) for _ in range(stages + 1)]
    start = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                largest = max(best[k - 1][j], prefix[i] - prefix[j])
                if largest < best[k][i]:
                    best[k][i], start[k][i] = largest, j
    groups, end = [], n
    for k in range(stages, 0, -1):
        groups.append(list(range(start[k][end], end)))
        end = start[k][end]
    return groups[::-1]
