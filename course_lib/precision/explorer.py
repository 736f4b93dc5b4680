"""The bit-level explorer: a number's bits in every format as coloured HTML, in a text box that redraws (notebook 06).

    bits_html(value)                   the bits of one number in every format, coloured, with what rounding did to it
    format_explorer(initial)           a text box for a number (0.1, 1e-8, 2**-24, inf) that redraws bits_html
"""

from __future__ import annotations

import html
import math
import re

from course_lib.precision._checks import _real
from course_lib.precision.formats import FORMATS, Format, bit_fields, round_to

__all__ = ["bits_html", "format_explorer"]

# Colours of the three fields, light enough for black text (Okabe–Ito hues, as course_lib.diagrams uses).
SIGN_COLOUR = "#F4B6D2"  # reddish purple, lightened
EXPONENT_COLOUR = "#A9D8F5"  # sky blue, lightened
MANTISSA_COLOUR = "#F7D48A"  # orange, lightened


def _note(value: float, rounded: float, f: Format) -> str:
    """What happened to value in f: overflow, NaN, underflow, subnormal, or nothing to say."""
    if math.isnan(value):
        return "NaN"
    if math.isnan(rounded):  # e4m3 has no inf: older torch versions cast overflow to NaN
        return "inf → NaN (no inf in this format)" if math.isinf(value) else "overflow → NaN"
    if math.isinf(rounded):
        return "inf" if math.isinf(value) else "overflow → inf"
    if math.isinf(value):
        return f"inf → {rounded:g}: saturated (no inf in this format)"
    if abs(value) > f.max:
        top = math.frexp(f.max)[1] - 1  # the exponent of the top binade
        if abs(value) > f.max + 2.0 ** (top - f.mantissa_bits - 1):  # beyond rounding distance of max
            return f"overflow → saturated to {rounded:g}"
    if value != 0 and rounded == 0:
        return "underflow → 0"
    if rounded != 0 and abs(rounded) < f.smallest_normal:
        return "subnormal"
    return ""


def _bit_spans(fields: tuple[str, str, str]) -> str:
    cells = []
    for bits, colour in zip(fields, (SIGN_COLOUR, EXPONENT_COLOUR, MANTISSA_COLOUR)):
        cells.append("".join(f'<span style="background:{colour};padding:0 1px;color:#000">{b}</span>' for b in bits))
    return '<span style="font-family:monospace;white-space:nowrap">' + "&thinsp;".join(cells) + "</span>"


def _relative_error(value: float, rounded: float) -> str:
    if not (math.isfinite(value) and math.isfinite(rounded)):
        return "—"
    if value == 0:
        return "0" if rounded == 0 else "—"
    error = abs(rounded - value) / abs(value)
    return "0 (exact)" if error == 0 else f"{error:.2e}"


def bits_html(value: float) -> str:
    """An HTML table of value in every format: coloured bits, the stored value, relative error, a note (notebook 06).

    Notes: "overflow → inf"; "underflow → 0"; "subnormal"; "NaN". fp8 e4m3 has no inf, and the note says what this
    torch's cast did: torch 2.14 saturates at ±448, for ±inf too (c10's fp8e4m3fn_from_fp32_value, changed in
    pytorch/pytorch#178817, April 2026); earlier versions gave NaN from 480 up.
    """
    if not _real(value):
        raise TypeError(f"value must be a real number, not {type(value).__name__}")
    value = float(value)
    th = 'style="text-align:left;padding:2px 10px 2px 0"'
    td = 'style="text-align:left;padding:2px 10px 2px 0"'
    rows = [f"<tr><th {th}>format</th><th {th}>bits (sign · exponent · mantissa)</th><th {th}>stored value</th>"
            f"<th {th}>relative error</th><th {th}>note</th></tr>"]
    for f in FORMATS.values():
        rounded = round_to(value, f)
        name = html.escape(f.name) + (" <small>(in fp32)</small>" if f.dtype is None else "")
        rows.append(f"<tr><td {td}>{name}</td><td {td}>{_bit_spans(bit_fields(value, f))}</td>"
                    f"<td {td}><code>{rounded!r}</code></td><td {td}>{_relative_error(value, rounded)}</td>"
                    f"<td {td}>{html.escape(_note(value, rounded, f))}</td></tr>")
    legend = " ".join(f'<span style="background:{c};padding:0 6px;color:#000">{n}</span>'
                      for n, c in (("sign", SIGN_COLOUR), ("exponent", EXPONENT_COLOUR), ("mantissa", MANTISSA_COLOUR)))
    return (f'<div><p style="margin:2px 0">{html.escape(repr(value))} in each format · {legend}</p>'
            f'<table style="border-collapse:collapse">{"".join(rows)}</table></div>')


_POWER = re.compile(r"^\s*([+-]?\d+(?:\.\d*)?)\s*(?:\*\*|\^)\s*([+-]?\d+)\s*$")


def _parse_number(text: str) -> float | None:
    """A float from '0.1', '1e-8', 'inf', '-nan', or a power like '2**-24' / '2^-24'; None if it is none of these."""
    try:
        return float(text)
    except ValueError:
        pass
    match = _POWER.match(text)
    if match:
        base, power = float(match.group(1)), int(match.group(2))
        try:
            return base**power
        except OverflowError:  # 2**5000: as float("1e5000"), inf
            return -math.inf if base < 0 and power % 2 else math.inf
        except ZeroDivisionError:  # 0**-1
            return None
    return None


def format_explorer(initial: str = "0.1"):
    """A text box for a number and, under it, its bits in every format (bits_html), redrawn as you type (notebook 06).

    Accepts 0.1, -3e5, 1e-8, inf, nan, and powers such as 2**-24 or 2^-24; anything else gets a message saying what
    to type. Returns the ipywidgets VBox (text box, HTML).
    """
    import ipywidgets as widgets

    if _real(initial):
        initial = repr(float(initial))
    if not isinstance(initial, str):
        raise TypeError(f"initial must be the text of a number, like '0.1', not {type(initial).__name__}")
    box = widgets.Text(value=initial, description="number", placeholder="0.1, 1e-8, 70000, 2**-24, inf",
                       continuous_update=True, layout=widgets.Layout(width="360px"))
    shown = widgets.HTML()

    def redraw(change=None):
        value = _parse_number(box.value)
        if value is None:
            shown.value = (f"<p><b>{html.escape(box.value.strip())!s}</b> is not a number: type a decimal (0.1), "
                           "scientific notation (1e-8), a power (2**-24), inf or nan.</p>")
        else:
            shown.value = bits_html(value)

    box.observe(redraw, names="value")
    redraw()
    return widgets.VBox([box, shown])
