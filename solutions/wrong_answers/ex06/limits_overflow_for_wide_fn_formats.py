"""Checks every argument but lets format_limits(11, m, has_inf=False) raise OverflowError from math.ldexp."""

LOSES = ["test_format_limits_of_any_width_or_a_value_error"]


def format_limits(exponent_bits, mantissa_bits, *, has_inf=True):
    for name, value, low, high in (("exponent_bits", exponent_bits, 2, 11), ("mantissa_bits", mantissa_bits, 1, 52)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{name} is {value!r}: pass a whole number of bits from {low} to {high}")
    if not isinstance(has_inf, bool):
        raise ValueError(f"has_inf is {has_inf!r}: pass True or False")
    e, m = exponent_bits, mantissa_bits
    bias = 2 ** (e - 1) - 1
    if has_inf:
        largest = math.ldexp(2.0 - math.ldexp(1.0, -m), bias)
    else:
        largest = math.ldexp(2.0 - math.ldexp(1.0, 1 - m), bias + 1)  # 2**1024 and up for e = 11: OverflowError
    return FormatLimits(max=largest, smallest_normal=math.ldexp(1.0, 1 - bias),
                        smallest_subnormal=math.ldexp(1.0, 1 - bias - m), eps=math.ldexp(1.0, -m))
