"""Computes the formula on whatever it is given: 0 stages, a bool, a float or a string go through or fail oddly."""

LOSES = ["test_bubble_fraction_rejects_bad_arguments"]


def bubble_fraction(stages, micro_batches):
    return (stages - 1) / (micro_batches + stages - 1)
