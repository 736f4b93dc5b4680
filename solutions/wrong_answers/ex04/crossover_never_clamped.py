"""Solves the equation without asking whether the tree ever wins: 0/0 for one rank, nonsense for two or three."""

LOSES = ["test_tree_all_reduce_crossover_alpha_beta"]


def tree_all_reduce_crossover(world_size, alpha, beta):
    if world_size < 1 or alpha < 0 or beta <= 0:
        raise ValueError("need world_size >= 1, alpha >= 0 and beta > 0")
    n = world_size
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    return (n - 1 - rounds) * alpha / ((rounds - (n - 1) / n) * beta)
