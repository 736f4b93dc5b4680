"""Converts a float count with int() without checking it is whole: 4.5 stages become 4."""

LOSES = ["test_bubble_fraction_rejects_bad_arguments", "test_pipeline_schedule_rejects_bad_arguments",
         "test_partition_rejects_bad_arguments"]


def _check_count(name, value, what):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 1:
        raise ValueError(f"{name} is {value!r}: pass the number of {what}, a whole number, 1 or more")
    return int(value)
