"""Computes with whatever it is given: True, 1 or 12 exponent bits, 0 mantissa bits, has_inf="no"."""

LOSES = ["test_format_limits_rejects_bad_arguments"]


def format_limits(exponent_bits, mantissa_bits, *, has_inf=True):
    e, m = exponent_bits, mantissa_bits
    bias = 2 ** (e - 1) - 1
    if has_inf:
        largest = math.ldexp(2.0 - math.ldexp(1.0, -m), bias)
    else:
        largest = math.ldexp(2.0 - math.ldexp(1.0, 1 - m), bias + 1)
    return FormatLimits(largest, math.ldexp(1.0, 1 - bias), math.ldexp(1.0, 1 - bias - m), math.ldexp(1.0, -m))
