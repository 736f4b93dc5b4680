"""Counts log2(n) tree rounds without rounding up, as if every world size were a power of two."""

LOSES = ["test_tree_all_reduce_crossover_alpha_beta"]


def tree_all_reduce_crossover(world_size, alpha, beta):
    if world_size < 1 or alpha < 0 or beta <= 0:
        raise ValueError("need world_size >= 1, alpha >= 0 and beta > 0")
    n = world_size
    rounds = math.log2(n)
    latency_saved = (n - 1 - rounds) * alpha
    bandwidth_lost = (rounds - (n - 1) / n) * beta
    if latency_saved <= 0 or bandwidth_lost <= 0:
        return 0.0
    return latency_saved / bandwidth_lost
