"""Uses the large-m approximation (p - 1) / m of the bubble (idle time over ideal time), not the idle fraction."""

LOSES = ["test_bubble_fraction_matches_the_idle_slots"]


def bubble_fraction(stages, micro_batches):
    _check_count("stages", stages, "pipeline stages")
    _check_count("micro_batches", micro_batches, "micro-batches")
    return float(stages - 1) / micro_batches
