"""Returns the exact fractions.Fraction instead of a Python float."""

LOSES = ["test_bubble_fraction_matches_the_idle_slots"]


def bubble_fraction(stages, micro_batches):
    from fractions import Fraction

    _check_count("stages", stages, "pipeline stages")
    _check_count("micro_batches", micro_batches, "micro-batches")
    return Fraction(stages - 1, micro_batches + stages - 1)
