"""Returns the int 0 where the tree is never faster, instead of the float 0.0."""

LOSES = ["test_tree_all_reduce_crossover_alpha_beta"]

_crossover = tree_all_reduce_crossover


def tree_all_reduce_crossover(world_size, alpha, beta):
    size = _crossover(world_size, alpha, beta)
    return 0 if size == 0 else size
