"""Converts every count with int() without checking it: 2.5 GPUs become 2, and nan or inf raise the wrong error."""

LOSES = ["test_model_state_bytes_rejects_bad_arguments"]


def _check_whole(name, value, minimum, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} is {value!r}: pass {what}, a whole number, {minimum} or more")
    try:
        value = int(value)
    except (OverflowError, ValueError):
        return 0
    if value < minimum:
        raise ValueError(f"{name} is {value!r}: pass {what}, a whole number, {minimum} or more")
    return value
