"""Reads the bubble off the lesson's course_lib.parallel.pipeline instead of computing it: the tests switch it off."""

LOSES = ["test_bubble_fraction_matches_the_idle_slots"]


def bubble_fraction(stages, micro_batches):
    from course_lib.parallel.pipeline import gpipe_bubble

    _check_count("stages", stages, "pipeline stages")
    _check_count("micro_batches", micro_batches, "micro-batches")
    return float(gpipe_bubble(stages, micro_batches))
