"""course_lib.precision: notebook 06's formats, rounding, loss scaling and GPU model, against independent references.

References: torch.finfo; Python's struct module (IEEE half and single precision, rounded by the C library, not by
torch); fp8 values decoded from their bits by hand; plain arithmetic.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
import struct

import matplotlib
import pytest
import torch
from matplotlib.figure import Figure

from course_lib.precision import (FORMATS, GPU_PEAKS, Format, GPUPeaks, ScalerTrace, amdahl_speedup, bit_fields,
                                  bits_html, format_explorer, format_picture, fp8_cast, fp8_demo_tensors,
                                  fp8_scaling_run, gradient_histogram, limits_table, low_precision_sum, lost_update,
                                  matmul_prediction, plot_losses, plot_scale_history, print_limits, round_to,
                                  roofline_time, scaler_demo_gradients, train_with_scaler, underflow_fraction)

matplotlib.use("Agg")

# ------------------------------------------------------------------------------------------- independent references


def f32(v: float) -> float:
    """v rounded to IEEE single precision by the C library; inf beyond its range."""
    try:
        return struct.unpack("<f", struct.pack("<f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", f32(v)))[0]


def from_f32_bits(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def f16(v: float) -> float:
    """v rounded as torch does it: float64 to float32, then to IEEE half precision (struct's 'e')."""
    v = f32(v)
    if math.isinf(v) or math.isnan(v):
        return v
    try:
        return struct.unpack("<e", struct.pack("<e", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def f16_bits(v: float) -> int:
    return struct.unpack("<H", struct.pack("<e", f16(v)))[0]


def keep_top_bits(v: float, mantissa_bits: int) -> int:
    """The fp32 bits of v with the mantissa rounded to mantissa_bits, to nearest, ties to even (Python ints)."""
    bits = f32_bits(v)
    low = 23 - mantissa_bits
    if (bits & 0x7F800000) == 0x7F800000:
        return bits
    kept, rest = bits >> low, bits & ((1 << low) - 1)
    half = 1 << (low - 1)
    if rest > half or (rest == half and kept & 1):
        kept += 1
    return kept << low


def bf16(v: float) -> float:
    return from_f32_bits(keep_top_bits(v, 7))


def tf32(v: float) -> float:
    return from_f32_bits(keep_top_bits(v, 10))


def fp8_values(exponent_bits: int, mantissa_bits: int, has_inf: bool) -> dict[int, float]:
    """Every non-negative finite fp8 value by its bit pattern, decoded from the bits by hand."""
    bias = 2 ** (exponent_bits - 1) - 1
    values = {}
    for pattern in range(2 ** (exponent_bits + mantissa_bits)):
        e, m = pattern >> mantissa_bits, pattern & (2**mantissa_bits - 1)
        top = e == 2**exponent_bits - 1
        if top and (has_inf or m == 2**mantissa_bits - 1):
            continue  # inf / NaN
        if e == 0:
            values[pattern] = m * 2.0 ** (1 - bias - mantissa_bits)
        else:
            values[pattern] = (1 + m / 2**mantissa_bits) * 2.0 ** (e - bias)
    return values


def fp8_round(v: float, exponent_bits: int, mantissa_bits: int, has_inf: bool) -> float:
    """v (within range) rounded to the nearest fp8 value, ties to the even bit pattern."""
    table = fp8_values(exponent_bits, mantissa_bits, has_inf)
    a = abs(f32(v))
    best = min(table, key=lambda p: (abs(table[p] - a), p & 1))
    return math.copysign(table[best], v)


def random_values(n: int, seed: int, low: int = -30, high: int = 20) -> list[float]:
    rng = random.Random(seed)
    return [rng.choice((-1, 1)) * rng.uniform(1, 2) * 2.0 ** rng.randint(low, high) for _ in range(n)]


# ------------------------------------------------------------------------------------------- formats and limits


def test_formats_are_the_six_in_order_with_their_bits_and_dtypes():
    assert list(FORMATS) == ["fp32", "tf32", "fp16", "bf16", "fp8 e4m3", "fp8 e5m2"]
    expected = {"fp32": (8, 23, torch.float32, True), "tf32": (8, 10, None, True), "fp16": (5, 10, torch.float16, True),
                "bf16": (8, 7, torch.bfloat16, True), "fp8 e4m3": (4, 3, torch.float8_e4m3fn, False),
                "fp8 e5m2": (5, 2, torch.float8_e5m2, True)}
    for name, f in FORMATS.items():
        assert isinstance(f, Format) and f.name == name and f.use
        assert (f.exponent_bits, f.mantissa_bits, f.dtype, f.has_inf) == expected[name]
        if f.dtype is not None:
            assert f.bits == torch.finfo(f.dtype).bits == 8 * f.storage_bytes
    assert FORMATS["tf32"].bits == 19 and FORMATS["tf32"].storage_bytes == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        FORMATS["fp16"].mantissa_bits = 7


def test_limits_from_the_bits_agree_with_torch_finfo_and_bit_patterns():
    rows = {r["format"]: r for r in limits_table()}
    assert list(rows) == list(FORMATS)
    smallest_subnormal = {  # bit pattern 1, decoded without torch
        "fp32": from_f32_bits(1), "tf32": from_f32_bits(1 << 13), "fp16": struct.unpack("<e", struct.pack("<H", 1))[0],
        "bf16": from_f32_bits(1 << 16), "fp8 e4m3": 2.0**-9, "fp8 e5m2": 2.0**-16}
    for name, f in FORMATS.items():
        row = rows[name]
        assert row["agree"] is True, row
        assert row["smallest subnormal"] == row["torch smallest subnormal"] == smallest_subnormal[name]
        if f.dtype is not None:
            info = torch.finfo(f.dtype)
            assert (row["max"], row["smallest normal"], row["eps"]) == (info.max, info.smallest_normal, info.eps)
    # The research notes' table (notebook 06), and tf32's limits from fp32's bits.
    assert rows["fp16"]["max"] == 65504 and rows["fp8 e4m3"]["max"] == 448 and rows["fp8 e5m2"]["max"] == 57344
    assert rows["bf16"]["eps"] == 2**-7 and rows["fp8 e4m3"]["smallest normal"] == 2**-6
    assert rows["tf32"]["max"] == struct.unpack("<f", struct.pack("<I", 0x7F7FE000))[0]
    assert rows["tf32"]["eps"] == rows["fp16"]["eps"] == 2**-10


def test_print_limits_prints_every_format(capsys):
    print_limits()
    out = capsys.readouterr().out
    for name in FORMATS:
        assert name in out
    assert "6.55e+04" in out and "448" in out and " NO" not in out
    assert max(len(line) for line in out.splitlines()) <= 110


# ------------------------------------------------------------------------------------------- rounding and bits


def test_round_to_matches_the_c_librarys_rounding():
    values = random_values(400, seed=1) + [0.1, 1 / 3, 65504, 65519, 65520, 1e-8, 3e-8, 5e-8, -0.0, 1e39, math.inf]
    for v in values:
        assert round_to(v, "fp32") == f32(v), v
        assert round_to(v, "fp16") == f16(v), v
        assert round_to(v, "bf16") == bf16(v), v
        assert round_to(v, "tf32") == tf32(v), v
    assert math.isnan(round_to(math.nan, "fp16"))


def test_round_to_fp8_is_the_nearest_value_ties_to_even_within_range():
    for name, (e, m, inf, top) in {"fp8 e4m3": (4, 3, False, 448), "fp8 e5m2": (5, 2, True, 57344)}.items():
        for v in random_values(300, seed=2, low=-20, high=8 if e == 4 else 15):
            if abs(v) <= top:
                assert round_to(v, name) == fp8_round(v, e, m, inf), (name, v)
    # Ties: 17 lies halfway between 16 and 18 in e4m3; 464 halfway between 448 and 480 (480 would be the NaN pattern).
    assert round_to(17.0, "fp8 e4m3") == 16.0 and round_to(464.0, "fp8 e4m3") == 448.0
    assert round_to(61439.0, "fp8 e5m2") == 57344 and round_to(61440.0, "fp8 e5m2") == math.inf


def test_fp8_e4m3_out_of_range_is_what_this_torch_casts_and_bits_html_says_so():
    cast = torch.tensor([1000.0, -1000.0, math.inf]).to(torch.float8_e4m3fn).to(torch.float64).tolist()
    html = bits_html(1000.0)
    e4m3_row = next(row for row in html.split("<tr>") if row.startswith("<td") and "fp8 e4m3" in row)
    if math.isnan(cast[0]):  # torch before pytorch/pytorch#178817
        assert math.isnan(round_to(1000.0, "fp8 e4m3")) and "overflow → NaN" in e4m3_row
    else:  # torch 2.14: saturation, infinities included
        assert cast == [448.0, -448.0, 448.0]
        assert round_to(1000.0, "fp8 e4m3") == 448.0 and round_to(-math.inf, "fp8 e4m3") == -448.0
        assert "overflow → saturated to 448" in e4m3_row
    assert "saturated" not in next(row for row in bits_html(450.0).split("<tr>") if "fp8 e4m3" in row)


def test_round_to_keeps_the_kind_and_leaves_tensors_alone():
    x = torch.tensor([[0.1, 1e-8], [70000.0, -2.5]], dtype=torch.float32)
    before = x.clone()
    for name in FORMATS:
        out = round_to(x, name)
        assert out.dtype == torch.float64 and out.shape == x.shape and out.data_ptr() != x.data_ptr()
        one_by_one = torch.tensor([[round_to(v, name) for v in row] for row in x.tolist()], dtype=torch.float64)
        # equal_nan: 70000 in fp8 e4m3 is NaN before torch 2.14 (which saturates it at 448)
        torch.testing.assert_close(out, one_by_one, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(x, before)
    assert isinstance(round_to(1, "bf16"), float) and round_to(1, "bf16") == 1.0


def test_bit_fields_are_the_ieee_bits():
    for v in random_values(100, seed=3) + [0.1, -2.0, 1e-8, 70000.0, math.inf]:
        fp32 = format(f32_bits(v), "032b")
        assert bit_fields(v, "fp32") == (fp32[0], fp32[1:9], fp32[9:])
        fp16 = format(f16_bits(v), "016b")
        assert bit_fields(v, "fp16") == (fp16[0], fp16[1:6], fp16[6:])
        top16 = format(keep_top_bits(v, 7) >> 16, "016b")
        assert bit_fields(v, "bf16") == (top16[0], top16[1:9], top16[9:])
        top19 = format(keep_top_bits(v, 10) >> 13, "019b")
        assert bit_fields(v, "tf32") == (top19[0], top19[1:9], top19[9:])
    assert bit_fields(1.0, "bf16") == ("0", "01111111", "0000000")
    assert bit_fields(-2.0, "fp8 e4m3") == ("1", "1000", "000")
    assert bit_fields(448.0, "fp8 e4m3") == ("0", "1111", "110")
    assert bit_fields(2.0**-16, "fp8 e5m2") == ("0", "00000", "01")


def _rows(html: str) -> dict[str, str]:
    rows = {}
    for row in html.split("<tr>")[2:]:
        name = re.sub(r"<.*?>", "", row.split("</td>")[0]).replace("(in fp32)", "").strip()
        rows[name] = row
    return rows


def test_bits_html_colours_each_field_and_labels_what_happened():
    rows = _rows(bits_html(1e-8))
    assert list(rows) == list(FORMATS)
    for name, row in rows.items():
        by_colour = {}
        for colour, bit in re.findall(r'background:(#[0-9A-F]+);padding:0 1px;color:#000">([01])<', row):
            by_colour.setdefault(colour, []).append(bit)
        assert ["".join(bits) for bits in by_colour.values()] == list(bit_fields(1e-8, name)), name
        assert f"<code>{round_to(1e-8, name)!r}</code>" in row
    assert "underflow → 0" in rows["fp16"] and "underflow → 0" not in rows["bf16"]
    relative = abs(bf16(1e-8) - 1e-8) / 1e-8
    assert f"{relative:.2e}" in rows["bf16"]
    assert "subnormal" in _rows(bits_html(2.0**-20))["fp16"]
    assert "overflow → inf" in _rows(bits_html(70000.0))["fp16"]
    assert "overflow → inf" not in _rows(bits_html(70000.0))["bf16"]
    assert all("NaN" in row for row in _rows(bits_html(math.nan)).values())


def test_format_explorer_updates_when_the_text_changes():
    import ipywidgets as widgets

    explorer = format_explorer()
    assert isinstance(explorer, widgets.VBox)
    text, shown = explorer.children
    assert isinstance(text, widgets.Text) and isinstance(shown, widgets.HTML)
    assert text.value == "0.1" and shown.value == bits_html(0.1)
    text.value = "70000"
    assert shown.value == bits_html(70000.0) and "overflow → inf" in shown.value
    text.value = "2**-24"
    assert shown.value == bits_html(2.0**-24) and "subnormal" in _rows(shown.value)["fp16"]
    text.value = "2**5000"
    assert shown.value == bits_html(math.inf)
    text.value = "ten"
    assert "is not a number" in shown.value and "<table" not in shown.value
    text.value = "<b>x</b>"
    assert "&lt;b&gt;" in shown.value  # what was typed is escaped, not rendered
    assert format_explorer("1e-8").children[1].value == bits_html(1e-8)


# ------------------------------------------------------------------------------------------- pictures


def _labelled(ax) -> bool:
    return bool(ax.get_xlabel().strip()) and bool(ax.get_ylabel().strip())


def test_format_picture_draws_each_layout_in_proportion():
    from matplotlib.patches import Rectangle

    fig = format_picture()
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert _labelled(ax)
    boxes = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(boxes) == 3 * len(FORMATS)
    for i, f in enumerate(FORMATS.values()):
        widths = [b.get_width() for b in boxes[3 * i:3 * i + 3]]
        assert widths == [1, f.exponent_bits, f.mantissa_bits]
        assert len({b.get_facecolor() for b in boxes[3 * i:3 * i + 3]}) == 3
    assert [t.get_text() for t in ax.get_yticklabels()][0].startswith("fp32")


def test_gradient_histogram_marks_fp16_and_bf16_limits():
    grads = [torch.tensor([1e-9, 1e-7, 0.0, 1.0]), None, torch.full((3, 3), 2.0**-30)]
    fig = gradient_histogram(grads)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert _labelled(ax) and "fp16" in ax.get_title()
    lines = sorted(line.get_xdata()[0] for line in ax.get_lines())
    assert lines == pytest.approx(sorted([-24, -14, math.log2(65504), -126]))
    assert sum(patch.get_height() for patch in ax.patches) == 12  # the nonzero values only
    import matplotlib.pyplot as plt

    own, axis = plt.subplots()
    assert gradient_histogram(grads, ax=axis) is own
    plt.close(own)


def test_underflow_fraction_counts_the_values_a_cast_loses():
    grads = [torch.tensor([1e-9, 1e-7, 0.0, 1.0]), None, torch.tensor([[2.0**-26]])]
    assert underflow_fraction(grads, torch.float16) == pytest.approx(2 / 4)  # 1e-9 and 2^-26; 1e-7 is a subnormal
    assert underflow_fraction(grads, "bf16") == 0.0
    assert underflow_fraction(torch.tensor([1e-3, 1e-5]), "fp8 e4m3") == 0.5
    demo = scaler_demo_gradients()
    assert underflow_fraction(demo[:1], torch.float16) == 1.0  # the output's gradient: below 2^-25, all of it
    assert all(g.abs().max() < 1e-5 for g in demo)


def test_plots_of_training_runs_are_labelled():
    trace = train_with_scaler(30, init_scale=2.0**44)
    fig = plot_scale_history(trace)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    top, bottom = fig.axes
    assert top.get_ylabel() and bottom.get_xlabel() and bottom.get_ylabel()
    assert top.get_yscale() == "log"
    marked = [line for line in top.get_lines() if line.get_marker() == "x"]
    assert len(marked) == 1 and len(marked[0].get_xdata()) == sum(trace.skipped) > 0
    plain = train_with_scaler(5, dtype=torch.float32)
    fig = plot_losses([plain, trace])
    assert _labelled(fig.axes[0])
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["fp32", "fp16 autocast + GradScaler"]
    assert plot_scale_history(plain).axes[0].get_title().startswith("fp32")


# ------------------------------------------------------------------------------------------- arithmetic


def test_lost_update_is_the_rounded_sum():
    assert lost_update(256, 1, torch.bfloat16) == 256.0 and lost_update(256, 2, torch.bfloat16) == 258.0
    assert lost_update(2048, 1, torch.float16) == 2048.0 and lost_update(1024, 1, torch.float16) == 1025.0
    assert lost_update(1.0, 1e-8, torch.float32) == 1.0
    for w, u in zip(random_values(50, seed=4, low=-2, high=6), random_values(50, seed=5, low=-12, high=0)):
        assert lost_update(w, u, torch.float16) == f16(f16(w) + f16(u))
        assert lost_update(w, u, "bf16") == bf16(bf16(w) + bf16(u))
    assert lost_update(16, 1, "fp8 e4m3") == 16.0 and lost_update(16, 3, "fp8 e4m3") == 20.0  # ulp 2: 17 ties to 16


def test_low_precision_sum_stalls_as_the_research_notes_say():
    assert low_precision_sum(0.01, 1000, torch.bfloat16) == 4.0
    assert low_precision_sum(0.01, 1000, torch.float16) == 9.953125
    assert low_precision_sum(0.01, 1000, torch.float32) == pytest.approx(10.0001335, abs=1e-6)
    total, step = 0.0, f16(0.01)
    for _ in range(1000):
        total = f16(total + step)
    assert total == 9.953125
    total, step = 0.0, bf16(0.01)
    for _ in range(1000):
        total = bf16(total + step)
    assert total == low_precision_sum(0.01, 1000, "bf16")
    assert low_precision_sum(0.5, 0, "fp16") == 0.0
    assert low_precision_sum(1.0, 40, "fp8 e4m3") == 16.0  # 16 + 1 rounds back to 16


# ------------------------------------------------------------------------------------------- loss scaling


@pytest.fixture(scope="module")
def runs():
    return {name: train_with_scaler(120, dtype=dtype, use_scaler=scaler) for name, dtype, scaler in [
        ("fp32", torch.float32, False), ("bf16", torch.bfloat16, False), ("fp16+scaler", torch.float16, True),
        ("fp16", torch.float16, False)]}


def test_fp16_without_a_scaler_stalls_while_the_others_learn(runs):
    stalled = runs["fp16"]
    assert stalled.loss[-1] == pytest.approx(stalled.loss[0], rel=0.01)
    assert all(z == 1.0 for z in stalled.zero_grads) and not any(stalled.updated)
    for name in ("fp32", "bf16", "fp16+scaler"):
        trace = runs[name]
        assert trace.loss[-1] < 0.1 * trace.loss[0], name
        assert trace.loss[0] == pytest.approx(stalled.loss[0], rel=0.01)  # the same start
    assert runs["fp16+scaler"].loss[-1] == pytest.approx(runs["fp32"].loss[-1], rel=0.2)
    assert [t.label for t in runs.values()] == ["fp32", "bf16 autocast", "fp16 autocast + GradScaler",
                                                 "fp16 autocast, no scaler"]
    assert runs["fp32"].scale == [1.0] * 120 and not any(runs["bf16"].skipped)


def test_skipped_steps_are_the_scale_drops_and_change_nothing():
    trace = train_with_scaler(60, init_scale=2.0**46, growth_interval=5)
    assert isinstance(trace, ScalerTrace) and len(trace.loss) == len(trace.scale) == len(trace.skipped) == 60
    assert trace.skipped[0] and sum(trace.skipped) >= 3
    for i in range(59):
        now, following = trace.scale[i], trace.scale[i + 1]
        assert trace.skipped[i] == (following < now), i
        assert trace.updated[i] == (not trace.skipped[i]), i  # a skipped step leaves the weights as they were
        assert following in (now / 2, now, now * 2)
        if trace.skipped[i]:
            assert following == now / 2
    grew = [i for i in range(59) if trace.scale[i + 1] > trace.scale[i]]
    for i in grew:  # growth only after growth_interval clean steps in a row
        assert not any(trace.skipped[i - 4:i + 1])
    assert train_with_scaler(60, init_scale=2.0**46, growth_interval=5) == trace  # deterministic


def test_train_with_scaler_rejects_bad_arguments():
    for kwargs, error in [(dict(steps=0), ValueError), (dict(steps=2.5), TypeError),
                          (dict(steps=2, dtype=torch.float64), ValueError),
                          (dict(steps=2, use_scaler="yes"), TypeError), (dict(steps=2, init_scale=0), ValueError),
                          (dict(steps=2, growth_interval=0), ValueError), (dict(steps=2, seed=-1), ValueError),
                          (dict(steps=2, loss_weight=math.nan), ValueError)]:
        with pytest.raises(error):
            train_with_scaler(**kwargs)
    with pytest.raises(TypeError, match="ScalerTrace"):
        plot_scale_history([1.0, 2.0])


# ------------------------------------------------------------------------------------------- GPU model


def test_gpu_peaks_are_the_published_dense_figures():
    assert GPU_PEAKS.tflops == {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8 e4m3": 1978.9,
                                "fp8 e5m2": 1978.9}
    assert GPU_PEAKS["bf16"] == 989.4 and GPU_PEAKS.bandwidth_Bps == 3.35e12
    with pytest.raises(TypeError):
        GPU_PEAKS.tflops["bf16"] = 1.0  # read-only
    assert "glennklockwood.com" in GPU_PEAKS.source and "3.35" in GPU_PEAKS.source
    with pytest.raises(ValueError):
        GPUPeaks("bad", {"fp16": -1.0}, 1.0, "test")
    with pytest.raises(ValueError, match="unknown format"):
        GPUPeaks("bad", {"fp64": 1.0}, 1.0, "test")


def test_roofline_and_matmul_prediction_are_the_plain_arithmetic():
    assert roofline_time(2e12, 1e9, "bf16") == pytest.approx(max(2e12 / 989.4e12, 1e9 / 3.35e12))
    assert roofline_time(1e9, 1e12, "fp32") == pytest.approx(1e12 / 3.35e12)
    peaks = GPUPeaks("toy", {"fp16": 100.0}, 1.0, "made up")
    assert roofline_time(1e12, 0, "fp16", peaks) == pytest.approx(0.01)
    with pytest.raises(ValueError, match="no published peak"):
        roofline_time(1, 1, "bf16", peaks)
    for n, fmt in [(256, "bf16"), (8192, "bf16"), (4096, "fp8 e4m3"), (4096, "tf32"), (64, "fp32")]:
        p = matmul_prediction(n, fmt)
        size = {"bf16": 2, "fp8 e4m3": 1, "tf32": 4, "fp32": 4}[fmt]
        assert p.flops == 2 * n**3 and p.bytes_moved == 3 * n * n * size
        compute, memory = 2 * n**3 / (GPU_PEAKS[fmt] * 1e12), 3 * n * n * size / 3.35e12
        assert p.seconds == pytest.approx(max(compute, memory))
        assert p.bound == ("compute" if compute >= memory else "memory")
        assert p.tflops <= GPU_PEAKS[fmt] * (1 + 1e-9)
    assert matmul_prediction(256, "bf16").bound == "memory" and matmul_prediction(8192, "bf16").bound == "compute"
    halved = matmul_prediction(8192, "bf16").seconds / 2  # fp8's peak is 1978.9, bf16's 989.4: twice, to 0.01%
    assert matmul_prediction(8192, "fp8 e4m3").seconds == pytest.approx(halved, rel=1e-4)


def test_amdahl_speedup():
    assert amdahl_speedup(0.7, 2) == pytest.approx(1 / (0.3 + 0.35))
    assert amdahl_speedup(0, 10) == 1.0 and amdahl_speedup(0.5, 1) == 1.0
    assert amdahl_speedup(0.9, math.inf) == pytest.approx(10.0) and amdahl_speedup(1, math.inf) == math.inf
    for bad in [(-0.1, 2), (1.5, 2), (0.5, 0), (0.5, -1), (math.nan, 2), (0.5, math.nan)]:
        with pytest.raises(ValueError):
            amdahl_speedup(*bad)


# ------------------------------------------------------------------------------------------- fp8 scaling


def test_fp8_cast_saturates_then_rounds_to_the_nearest_fp8_value():
    values = random_values(200, seed=5, low=-12, high=3) + [0.0, 1.0, -1.0, 2.9, -3.5, 1e-9]
    scale = 128.0
    got, saturated = fp8_cast(torch.tensor(values), scale)
    top = 448.0
    want = [fp8_round(max(-top, min(top, f32(v) * scale)), 4, 3, False) / scale for v in values]
    assert got.dtype == torch.float32 and got.tolist() == pytest.approx(want, rel=1e-7, abs=0)
    # Saturated: beyond 448 + 16, the values that round to 448 anyway (464 is a tie, to the even 448).
    assert saturated == pytest.approx(sum(abs(f32(v) * scale) > top + 16 for v in values) / len(values))
    assert saturated > 0  # 3.5 · 128 = 448 does not saturate, 2**3 · 1.x · 128 does
    edge, edge_saturated = fp8_cast(torch.tensor([464.0, 464.5, -1000.0, 448.0]), 1.0)
    assert edge.tolist() == [448.0, 448.0, -448.0, 448.0] and edge_saturated == 0.5
    e5m2, none = fp8_cast(torch.tensor([1e6, -1e6]), 1.0, "fp8 e5m2")
    assert e5m2.tolist() == [57344.0, -57344.0] and none == 1.0  # clamped before the cast: never inf, never NaN


def _reference_run(tensors, recipe, history_len, margin=0):
    """(scale, saturated) per tensor from the recipe's definition, in plain Python."""
    rows, history, scale = [], [], 1.0
    for t in tensors:
        xs = [f32(v) for v in t.tolist()]
        amax = max(abs(v) for v in xs)
        reference = amax if recipe == "current" or not history else max(history)
        if reference > 0:
            scale = 448.0 / reference / 2**margin
        scale32 = f32(scale)  # torch multiplies a float32 tensor by a Python float in float32
        rows.append((scale, sum(abs(f32(v * scale32)) > 448.0 + 16 for v in xs) / len(xs)))
        history = (history + [amax])[-history_len:]
    return rows


def test_delayed_scaling_saturates_when_the_amax_jumps_and_current_scaling_does_not():
    tensors = fp8_demo_tensors(10, spike_at=5, spike=8.0, size=512, seed=3)
    assert [t.shape for t in tensors] == [(512,)] * 10
    assert tensors[5].abs().max() > 5 * max(t.abs().max() for i, t in enumerate(tensors) if i != 5)
    for recipe, history_len in (("current", 16), ("delayed", 16), ("delayed", 2)):
        rows = fp8_scaling_run(tensors, recipe, history_len=history_len)
        want = _reference_run(tensors, recipe, history_len)
        assert [r.step for r in rows] == list(range(10))
        for row, (scale, saturated) in zip(rows, want):
            assert row.scale == pytest.approx(scale, rel=1e-12) and row.saturated == pytest.approx(saturated)
            assert row.amax == pytest.approx(max(abs(v) for v in tensors[row.step].tolist()))
            values, _ = fp8_cast(tensors[row.step], row.scale)
            assert row.error == pytest.approx(((values - tensors[row.step]).norm() / tensors[row.step].norm()).item())
    current = fp8_scaling_run(tensors, "current")
    delayed = fp8_scaling_run(tensors, "delayed", history_len=16)
    assert all(r.saturated == 0 for r in current) and max(r.error for r in current) < 0.05
    assert delayed[5].saturated > 0.3 and delayed[5].error > 10 * current[5].error
    assert all(r.scale == delayed[6].scale for r in delayed[6:])  # the spike's amax stays in the 16-step history
    short = fp8_scaling_run(tensors, "delayed", history_len=2)
    amax_6_7 = max(tensors[6].abs().max().item(), tensors[7].abs().max().item())
    assert short[8].scale == pytest.approx(448 / amax_6_7)  # with a history of 2, the spike is forgotten by step 8
    halved = fp8_scaling_run(tensors, "current", margin=1)
    assert [r.scale for r in halved] == pytest.approx([r.scale / 2 for r in current])


def test_fp8_scaling_rejects_bad_arguments():
    t = torch.randn(8)
    with pytest.raises(ValueError, match="recipe must be one of 'current', 'delayed'"):
        fp8_scaling_run([t], "tensorwise")
    with pytest.raises(ValueError, match="fp8 format"):
        fp8_cast(t, 1.0, "bf16")
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        fp8_cast(t, 0.0)
    with pytest.raises(ValueError, match="history_len must be 1 or more"):
        fp8_scaling_run([t], "delayed", history_len=0)
    with pytest.raises(ValueError, match=r"tensors\[1\] must be a floating-point tensor of finite values"):
        fp8_scaling_run([t, torch.tensor([math.inf])])
    with pytest.raises(TypeError, match="iterable of tensors"):
        fp8_scaling_run(3)
    with pytest.raises(ValueError, match="spike must be"):
        fp8_demo_tensors(spike=-1.0)


# ------------------------------------------------------------------------------------------- error messages


def test_bad_arguments_get_messages_that_say_what_to_pass():
    with pytest.raises(ValueError, match="unknown format 'fp64'.*'fp32', 'tf32', 'fp16', 'bf16'"):
        round_to(0.1, "fp64")
    with pytest.raises(TypeError, match="format name"):
        round_to(0.1, torch.float16)
    with pytest.raises(TypeError, match="real number"):
        round_to("0.1", "fp16")
    with pytest.raises(TypeError, match="real-valued"):
        round_to(torch.tensor([True]), "fp16")
    with pytest.raises(TypeError):
        bit_fields(True, "fp16")
    with pytest.raises(TypeError):
        bits_html("0.1")
    with pytest.raises(ValueError, match="tf32 has no torch dtype"):
        lost_update(1.0, 1.0, "tf32")
    with pytest.raises(TypeError, match="floating-point torch dtype"):
        lost_update(1.0, 1.0, torch.int32)
    with pytest.raises(ValueError, match="count must be >= 0"):
        low_precision_sum(0.1, -1, torch.float16)
    with pytest.raises(TypeError, match="whole number"):
        low_precision_sum(0.1, 2.5, torch.float16)
    with pytest.raises(TypeError, match="whole number"):
        low_precision_sum(0.1, True, torch.float16)
    # a count may be an integral float (the course's rule for counts)
    assert low_precision_sum(0.1, 2.0, torch.float16) == low_precision_sum(0.1, 2, torch.float16)
    with pytest.raises(ValueError, match="no nonzero value"):
        underflow_fraction([torch.zeros(3), None], torch.float16)
    with pytest.raises(TypeError, match="iterable of tensors"):
        gradient_histogram(3.0)
    with pytest.raises(TypeError, match="floating-point tensors"):
        underflow_fraction([torch.tensor([1, 2])], torch.float16)
    with pytest.raises(ValueError, match="n must be 1 or more"):
        matmul_prediction(0, "bf16")
    with pytest.raises(ValueError, match="flops must be"):
        roofline_time(-1.0, 0.0, "bf16")
    with pytest.raises(TypeError, match="text of a number"):
        format_explorer(["0.1"])
