"""Takes the bias as 2**(exponent_bits - 1) instead of 2**(exponent_bits - 1) - 1: every limit off by a factor 2."""

LOSES = ["test_format_limits_match_torch_finfo", "test_format_limits_match_every_bit_pattern"]

_format_limits = format_limits


def format_limits(exponent_bits, mantissa_bits, *, has_inf=True):
    right = _format_limits(exponent_bits, mantissa_bits, has_inf=has_inf)
    return FormatLimits(right.max / 2, right.smallest_normal / 2, right.smallest_subnormal / 2, right.eps)
