"""Returns 0.0 for one rank (nothing to all-reduce) before checking alpha and beta."""

LOSES = ["test_tree_all_reduce_crossover_rejects_bad_input"]

_crossover = tree_all_reduce_crossover


def tree_all_reduce_crossover(world_size, alpha, beta):
    if world_size == 1:
        return 0.0
    return _crossover(world_size, alpha, beta)
