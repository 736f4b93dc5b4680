"""Rejects beta == 0 (a division by zero) but lets a negative beta through."""

LOSES = ["test_tree_all_reduce_crossover_rejects_bad_input"]


def tree_all_reduce_crossover(world_size, alpha, beta):
    if world_size < 1 or alpha < 0 or beta == 0:
        raise ValueError("need world_size >= 1, alpha >= 0 and beta != 0")
    n = world_size
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    latency_saved = (n - 1 - rounds) * alpha
    bandwidth_lost = (rounds - (n - 1) / n) * beta
    if latency_saved <= 0 or bandwidth_lost <= 0:
        return 0.0
    return latency_saved / bandwidth_lost
