"""Accepts only ints as counts: model_state_bytes(7.5e9, 64, 3), Ψ typed as the ZeRO paper types it, is refused."""

LOSES = ["test_model_state_bytes_gives_the_zero_papers_figure", "test_model_state_bytes_follows_the_formula_at_every_stage"]


def _check_whole(name, value, minimum, what):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} is {value!r}: pass {what}, a whole number, {minimum} or more")
    return value
