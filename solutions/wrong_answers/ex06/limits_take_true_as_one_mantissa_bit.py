"""Checks the widths with isinstance(..., int) only: format_limits(8, True) computes a format with 1 mantissa bit."""

LOSES = ["test_format_limits_rejects_bad_arguments"]

_solution_format_limits = format_limits


def format_limits(exponent_bits, mantissa_bits, *, has_inf=True):
    if isinstance(mantissa_bits, bool):
        mantissa_bits = int(mantissa_bits)
    if isinstance(exponent_bits, bool):
        exponent_bits = int(exponent_bits)
    return _solution_format_limits(exponent_bits, mantissa_bits, has_inf=has_inf)
