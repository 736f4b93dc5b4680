"""1F1B with p - s warm-up forwards and then one forward before each backward: one micro-batch too many in flight."""

LOSES = ["test_pipeline_schedule_matches_a_simulation", "test_pipeline_schedule_bubble_and_activation_memory"]


def pipeline_schedule(stages, micro_batches, kind="1f1b"):
    _check_count("stages", stages, "pipeline stages")
    _check_count("micro_batches", micro_batches, "micro-batches")
    if kind not in KINDS:
        raise ValueError(f"kind is {kind!r}: pass one of {', '.join(repr(k) for k in KINDS)}")
    p, m = stages, micro_batches
    orders = []
    for s in range(p):
        if kind == "gpipe":
            orders.append([("F", j) for j in range(m)] + [("B", j) for j in range(m)])
            continue
        warmup = min(p - s, m)
        order = [("F", j) for j in range(warmup)]
        for i in range(m - warmup):
            order += [("F", warmup + i), ("B", i)]
        orders.append(order + [("B", j) for j in range(m - warmup, m)])
    step, placed, free = {}, [0] * p, [0] * p
    while any(placed[s] < 2 * m for s in range(p)):
        for s in range(p):
            while placed[s] < 2 * m:
                op, j = orders[s][placed[s]]
                needs = (("F", s - 1, j) if s > 0 else None) if op == "F" else (
                    ("F", s, j) if s == p - 1 else ("B", s + 1, j))
                if needs is not None and needs not in step:
                    break
                at = max(free[s], step[needs] + 1 if needs is not None else 0)
                step[(op, s, j)], free[s], placed[s] = at, at + 1, placed[s] + 1
    return sorted((t, s, j, op) for (op, s, j), t in step.items())
