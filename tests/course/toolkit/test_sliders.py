"""course_lib.sliders: a log slider starts, in the browser, at the value it was given (lesson 08's model size at
ZeRO's 7.5B, lesson 05's compute time at the 34.5 ms measured), where a plain FloatLogSlider moves it to a step."""

from __future__ import annotations

import ast
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ipywidgets import FloatLogSlider

from course_lib.paths import ROOT
from course_lib.sliders import browser_start, log_slider

# What the handle's 'update' event gave ipywidgets (10 ** its value) in Chromium, with nouislider.js from
# ipywidgets 8.1's widgetsnbextension: (min, max, step, value) -> the value the browser starts at and sends back.
# browser_start gave the same, bit for bit, on 400 random sliders but one: a plain slider whose value was its max,
# off the grid, where V8's logarithm and Python's differ in the last bit (log_slider's values are on the grid).
SEEN_IN_CHROMIUM = [
    ((-1, math.log10(1500), 0.05, 7.5), 7.943282347242813),  # lesson 08's slider at first: "7.94"
    ((math.log10(0.075), math.log10(1500), 0.05, 7.5), 7.500000000000001),  # then: its min on the grid by hand
    ((-1.0249387366083003, 3.176091259055681, 0.05, 7.5), 7.499999999999993),  # now: log_slider(7.5, 0.1, 1500)
    ((-1.0121809049267263, 4.0, 0.05, 34.5), 34.49999999999995),  # lesson 05's compute time: log_slider(34.5, ...)
]


@pytest.mark.parametrize("slider, seen", SEEN_IN_CHROMIUM)
def test_browser_start_is_what_chromium_showed(slider, seen):
    low, high, step, value = slider
    assert browser_start(FloatLogSlider(value=value, base=10, min=low, max=high, step=step)) == seen


def test_a_plain_log_slider_starts_at_the_step_nearest_its_value():
    assert round(browser_start(FloatLogSlider(value=7.5, base=10, min=-1, max=math.log10(1500), step=0.05)), 2) == 7.94
    assert round(browser_start(FloatLogSlider(value=34.5, base=10, min=-1, max=4, step=0.05)), 1) == 35.5


@given(low=st.floats(1e-4, 1e3), span=st.floats(1.5, 1e6), at=st.floats(0, 1),
       step=st.sampled_from([0.01, 0.02, 0.05, 0.1, 0.25]), base=st.sampled_from([2, 10]))
def test_log_slider_starts_at_its_value_and_covers_the_range(low, span, at, step, base):
    high = low * span
    value = min(max(low * span ** at, low), high)
    slider = log_slider(value, low, high, step=step, base=base, description="x")
    assert browser_start(slider) == pytest.approx(value, rel=1e-12)
    assert slider.value == value and slider.description == "x"
    assert base ** slider.min <= low * (1 + 1e-9) and base ** slider.min > low / base ** step * (1 - 1e-9)
    assert base ** slider.max == pytest.approx(high, rel=1e-12)


@pytest.mark.parametrize("value, low, high, step", [(0, 0, 1, 0.1), (5, 1, 4, 0.1), (0.5, 1, 4, 0.1),
                                                     (2, 1, 4, 0), (2, -1, 4, 0.1)])
def test_log_slider_rejects_what_is_not_a_range_around_its_value(value, low, high, step):
    with pytest.raises(ValueError, match="low <= value <= high"):
        log_slider(value, low, high, step=step)


def test_lesson_08s_slider_starts_at_the_7_5b_its_text_names():
    cells = json.loads((ROOT / "notebooks" / "08_sharding_and_multinode.ipynb").read_text(encoding="utf-8"))["cells"]
    index = next(i for i, c in enumerate(cells) if "log_slider(" in "".join(c["source"]) and c["cell_type"] == "code")
    assert "the slider starts at ZeRO's 7.5B" in "".join(cells[index - 1]["source"])
    source = "".join(cells[index]["source"])
    call = next(node for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "log_slider")
    slider = log_slider(*[ast.literal_eval(a) for a in call.args],
                        **{k.arg: ast.literal_eval(k.value) for k in call.keywords})
    assert slider.value == 7.5 and slider.readout_format == ".3g"
    assert f"{browser_start(slider):.3g}" == "7.5"  # what the readout shows
    assert round(browser_start(slider) * 1e9) == 7_500_000_000 and "round(billions * 1e9)" in source
