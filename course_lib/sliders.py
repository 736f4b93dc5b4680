"""A log-scale slider that starts where the lesson says it does (notebooks 05 and 08).

ipywidgets' FloatLogSlider moves in steps of `step` (in powers of `base`) counted from `min`, and the slider the
browser draws (noUiSlider) puts its handle on the step nearest the value, then sends that back to the kernel:
FloatLogSlider(value=7.5, min=-1, step=0.05) shows 10**0.9 = 7.94 and the cell computes with 7.94. log_slider
counts the steps from the start value instead, so the start is one of them.
"""

from __future__ import annotations

import math

__all__ = ["log_slider", "browser_start"]


def _log(x: float, base: float) -> float:
    return math.log(x) / math.log(base)  # as ipywidgets' FloatLogSliderView computes it (logCalc)


def log_slider(value: float, low: float, high: float, *, step: float = 0.05, base: float = 10, **kwargs):
    """A FloatLogSlider that starts at `value` in the browser too, from `low` (moved down to a whole number of steps
    below `value`) to `high`; `kwargs` go to FloatLogSlider (description, readout_format, style...) (notebook 08)."""
    from ipywidgets import FloatLogSlider

    if not (0 < low <= value <= high and step > 0 and base > 1):
        raise ValueError(f"need 0 < low <= value <= high, step > 0 and base > 1, not low={low!r}, value={value!r}, "
                         f"high={high!r}, step={step!r}, base={base!r}")
    start = _log(value, base)
    low_end = start - math.ceil((start - _log(low, base)) / step - 1e-9) * step
    if base ** low_end > value:  # rounding: ipywidgets would raise the value to base ** min
        low_end -= step
    high_end = _log(high, base)
    while base ** high_end < value:  # ... or lower it to base ** max
        high_end = math.nextafter(high_end, math.inf)
    return FloatLogSlider(value=value, base=base, min=low_end, max=high_end, step=step, **kwargs)


def browser_start(slider) -> float:
    """The value a FloatLogSlider's handle starts at in the browser, and sends back to the kernel: noUiSlider's
    arithmetic (nouislider 15, as ipywidgets 8 ships it) on the slider's min, max, step and value."""
    low, high, step, base = slider.min, slider.max, slider.step, slider.base
    position = min(max(_log(slider.value, base), low), high)  # logCalc clamps to [min, max]
    percent = 100.0 if position >= high else (position - low) * 100 / (high - low)  # Spectrum.toStepping
    if percent != 100:  # getStep: the closest step (JavaScript's Math.round: halves go up)
        step_percent = step * 100 / (high - low)
        percent = math.floor(percent / step_percent + 0.5) * step_percent
    percent = min(max(percent, 0.0), 100.0)
    snapped = high if percent >= 100 else percent * (high - low) / 100 + low  # Spectrum.fromStepping
    return base ** snapped
