"""Ignores has_inf: the fn layout gets IEEE's largest value, 240 for float8_e4m3fn instead of 448."""

LOSES = ["test_format_limits_match_torch_finfo", "test_format_limits_match_every_bit_pattern"]

_format_limits = format_limits


def format_limits(exponent_bits, mantissa_bits, *, has_inf=True):
    _format_limits(exponent_bits, mantissa_bits, has_inf=has_inf)  # the checks
    return _format_limits(exponent_bits, mantissa_bits, has_inf=True)
