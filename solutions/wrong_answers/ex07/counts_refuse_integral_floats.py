"""Takes only Python ints as counts: 4.0 stages (and numpy's ints) are refused, though they are whole numbers."""

LOSES = ["test_bubble_fraction_matches_the_idle_slots", "test_pipeline_schedule_matches_a_simulation",
         "test_partition_minimises_the_costliest_stage"]


def _check_count(name, value, what):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} is {value!r}: pass the number of {what}, a whole number, 1 or more")
    return value
