"""Times the tree as one broadcast (ceil(log2 n) rounds), forgetting the reduce that comes before it."""

LOSES = ["test_tree_all_reduce_crossover_alpha_beta"]


def tree_all_reduce_crossover(world_size, alpha, beta):
    if world_size < 1 or alpha < 0 or beta <= 0:
        raise ValueError("need world_size >= 1, alpha >= 0 and beta > 0")
    n = world_size
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    # ring: 2(n-1) alpha + 2(n-1)/n S beta;  tree (wrongly): rounds * (alpha + S beta)
    latency_saved = (2 * (n - 1) - rounds) * alpha
    bandwidth_lost = (rounds - 2 * (n - 1) / n) * beta
    if latency_saved <= 0 or bandwidth_lost <= 0:
        return 0.0
    return latency_saved / bandwidth_lost
