"""Refuses a bit width given as an integral float (8.0) or a numpy integer: bit widths are counts, and 8.0 is 8."""

LOSES = ["test_format_limits_match_torch_finfo", "test_format_limits_match_every_bit_pattern"]

_solution_format_limits = format_limits


def format_limits(exponent_bits, mantissa_bits, *, has_inf=True):
    for name, value in (("exponent_bits", exponent_bits), ("mantissa_bits", mantissa_bits)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} is {value!r}: pass a whole number of bits (an int)")
    return _solution_format_limits(exponent_bits, mantissa_bits, has_inf=has_inf)
