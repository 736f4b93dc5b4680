"""Accepts any real number that is integral, float(value).is_integer(): True passes as 1 stage."""

LOSES = ["test_bubble_fraction_rejects_bad_arguments", "test_pipeline_schedule_rejects_bad_arguments",
         "test_partition_rejects_bad_arguments"]


def _check_count(name, value, what):
    if not isinstance(value, numbers.Real) or not float(value).is_integer() or value < 1:
        raise ValueError(f"{name} is {value!r}: pass the number of {what}, a whole number, 1 or more")
    return int(value)
