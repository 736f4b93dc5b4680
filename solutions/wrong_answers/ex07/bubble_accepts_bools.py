"""Checks isinstance(value, int) only: True and False pass as 1 and 0 stages."""

LOSES = ["test_bubble_fraction_rejects_bad_arguments"]


def bubble_fraction(stages, micro_batches):
    for name, value in (("stages", stages), ("micro_batches", micro_batches)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} is {value!r}: pass a whole number, 1 or more")
    return float(stages - 1) / (micro_batches + stages - 1)
