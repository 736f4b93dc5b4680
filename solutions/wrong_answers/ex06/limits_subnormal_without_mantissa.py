"""Takes the smallest subnormal as 2**-bias, forgetting that its one bit is the mantissa's last."""

LOSES = ["test_format_limits_match_torch_finfo", "test_format_limits_match_every_bit_pattern"]

_format_limits = format_limits


def format_limits(exponent_bits, mantissa_bits, *, has_inf=True):
    right = _format_limits(exponent_bits, mantissa_bits, has_inf=has_inf)
    return right._replace(smallest_subnormal=right.smallest_normal / 2)
