"""Gives the unit roundoff 2**-(m + 1) as eps, half the gap between 1.0 and the next value."""

LOSES = ["test_format_limits_match_torch_finfo", "test_format_limits_match_every_bit_pattern"]

_format_limits = format_limits


def format_limits(exponent_bits, mantissa_bits, *, has_inf=True):
    return _format_limits(exponent_bits, mantissa_bits, has_inf=has_inf)._replace(
        eps=math.ldexp(1.0, -mantissa_bits - 1))
