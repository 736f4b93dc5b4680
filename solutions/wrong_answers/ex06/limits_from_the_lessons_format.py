"""Reads the limits off the lesson's course_lib.precision.Format instead of computing them: the tests switch it off."""

LOSES = ["test_format_limits_match_torch_finfo", "test_format_limits_match_every_bit_pattern"]


def format_limits(exponent_bits, mantissa_bits, *, has_inf=True):
    from course_lib.precision import Format

    lesson = Format("any", exponent_bits, mantissa_bits, None, has_inf, "")
    return FormatLimits(lesson.max, lesson.smallest_normal, lesson.smallest_subnormal, lesson.eps)
