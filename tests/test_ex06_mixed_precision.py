"""Graded tests for exercise 06 (notebooks/06_mixed_precision.ipynb).

References are computed here, in the test process: torch.finfo and the bit pattern 1 of each dtype for the
format limits, and for small formats Hypothesis draws (2 to 5 exponent bits, 1 to 5 mantissa bits, both
layouts) a plain decoder that enumerates every bit pattern; Tensor.to(torch.bfloat16) for the rounding;
torch.amp.GradScaler("cpu") for the loss scaler, trained on the same data with the same planted inf, -inf
and NaN gradients; and the training recipe of torch's AMP documentation, with torch's GradScaler, for the
training step.

Generated inputs (Hypothesis): float32 bit patterns drawn field by field (ties with low halves of exactly
0x8000 on even and odd neighbours, 0x7FFF and 0x8001, subnormals, the largest finite values that round to inf,
±0, ±inf, NaNs whose payload is only low bits), in tensors from 0-d to 3-d, empty ones, transposed and strided;
training runs of 6 to 12 steps where Hypothesis chooses which steps get an inf, -inf or NaN in which gradient,
whether unscale_ is called by hand, the initial scale, the factors and the growth interval; scalers at float32's
limits, one per drawn example starting at the top (2**118 to 2**127 and float32's max: growing must keep the old
scale, not reach inf), one at the bottom (the smallest subnormals: backing off reaches 0, whose reciprocal is inf)
and one anywhere, fed gradients set directly to any float32 (entries of 2**127 or more whose sum overflows while
each is finite, some inf, -inf or NaN, some None), losses of every float dtype, 0-d and 1-d (scale() promotes as
torch does), an optimizer that is not hashable, and update() with nothing recorded; bit widths given as ints,
integral floats and numpy integers, and bad ones (bools, fractions, nan, inf, out of range, strings); and AMP steps
of 1 to 4 micro-batches in bfloat16 and float16, without clipping or with max_norm from 0.0 (every gradient
clipped to 0) to 1.0, with micro-batches whose gradients overflow.

While the learner's code runs, torch's own conversions to bfloat16 refuse to run (a TorchDispatchMode sees
every operator, however it was called; only .view(torch.bfloat16), which reinterprets bits, is allowed) and
so does torch's GradScaler (and the two operators it is built on). amp_train_step is watched: a GradScaler
subclass logs every call, in order, torch.nn.utils.clip_grad_norm_ is logged too, forward hooks record whether
autocast is on and the layers' output dtype, tensor hooks whether autocast is off during backward, and a
wrapped loss function whether the loss runs under autocast.
"""

from __future__ import annotations

import math
import struct
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from course_lib.grading import exception_raised_by, run
from course_lib.grading.audits import assert_rejects

TIMEOUT = 60  # s


def _type_name(value) -> str:
    return type(value).__name__


def _same_memory(a, b) -> bool:
    """Whether two non-empty tensors share memory (the same storage)."""
    return (a.numel() > 0 and b.numel() > 0
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


# ---------------------------------------------------------------- format_limits

FIELDS = ("max", "smallest_normal", "smallest_subnormal", "eps")

# torch's floating dtypes: (name, exponent bits, mantissa bits, has_inf)
TORCH_FORMATS = [("float16", 5, 10, True), ("bfloat16", 8, 7, True), ("float32", 8, 23, True),
                 ("float64", 11, 52, True), ("float8_e5m2", 5, 2, True), ("float8_e4m3fn", 4, 3, False)]


def _call(e, m, has_inf) -> str:
    return f"format_limits({e!r}, {m!r}{'' if has_inf else ', has_inf=False'})"


def _switch_off_other_limits():
    """torch.finfo, and the lesson's own Format (course_lib.precision), which computes these limits too, refuse."""
    message = ("format_limits must compute the limits from the field widths itself, not read them from torch.finfo or "
               "the lesson's course_lib.precision")

    def refused(*args, **kwargs):
        raise RuntimeError(message)

    torch.finfo = refused
    try:
        import course_lib.precision as precision
    except Exception:  # noqa: BLE001 - the lesson's module may not be there (a student's release has it)
        return
    lesson_format = getattr(precision, "Format", None)
    if isinstance(lesson_format, type):
        for name in ("max", "smallest_normal", "smallest_subnormal", "eps", "bias"):
            if isinstance(getattr(lesson_format, name, None), property):
                setattr(lesson_format, name, property(refused))
    for module in [m for key, m in sys.modules.items() if key.split(".")[:2] == ["course_lib", "precision"]]:
        for name in ("limits_table", "print_limits", "_torch_limits"):  # the package's names and formats.py's
            if callable(getattr(module, name, None)):
                setattr(module, name, refused)


def _limits_driver(module, cases):
    _switch_off_other_limits()
    out = []
    for e, m, has_inf in cases:
        result = module.format_limits(e, m, has_inf=has_inf)
        fields = {}
        for name in FIELDS:
            value = getattr(result, name, None)
            fields[name] = [_type_name(value), float(value) if isinstance(value, (int, float)) else None]
        out.append({"type": _type_name(result), "named_tuple": isinstance(result, module.FormatLimits),
                    "fields": fields})
    return out


def _check_limits(result, want: dict, where: str, source: str):
    assert result["named_tuple"], f"{where} must return a FormatLimits (the named tuple above it), got {result['type']}"
    for name in FIELDS:
        kind, value = result["fields"][name]
        assert kind == "float", f"{where}.{name} must be a Python float, got a {kind}"
        assert value == want[name], (
            f"{where}.{name} should be {want[name]!r} ({source}), got {value!r}"
            + (" (has_inf=False: the top exponent holds normal values, only all ones is NaN)"
               if name == "max" and "has_inf=False" in where else ""))


def _torch_limits(name: str) -> dict:
    dtype = getattr(torch, name)
    info = torch.finfo(dtype)
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[info.bits // 8]
    return {"max": float(info.max), "smallest_normal": float(info.smallest_normal),
            "smallest_subnormal": torch.tensor([1], dtype=ints).view(dtype).item(), "eps": float(info.eps)}


def _as_given(e, m, kind):
    """The two widths as ints, as integral floats (8.0: a bit width is a count) or as numpy integers."""
    return {"int": (e, m), "float": (float(e), float(m)), "numpy": (np.int64(e), np.int32(m))}[kind]


@pytest.mark.points(2)
def test_format_limits_match_torch_finfo():
    cases = [(name, *_as_given(e, m, kind), has_inf) for kind in ("int", "float", "numpy")
             for name, e, m, has_inf in TORCH_FORMATS]
    got = run("ex06", _limits_driver, [case[1:] for case in cases], timeout=TIMEOUT)
    for (name, e, m, has_inf), result in zip(cases, got):
        _check_limits(result, _torch_limits(name), f"{_call(e, m, has_inf)} (torch.{name})",
                      f"torch.finfo(torch.{name}), and the bit pattern 1 for the smallest subnormal"
                      + ("; a bit width given as an integral float or a numpy integer is the same count"
                         if not all(type(w) is int for w in (e, m)) else ""))


def _decode(bits: int, e: int, m: int, has_inf: bool):
    """The value of a bit pattern of the format, exactly: a Fraction, or "inf", "-inf", "nan"; and whether normal."""
    sign = -1 if (bits >> (e + m)) & 1 else 1
    exponent, mantissa = (bits >> m) & (2**e - 1), bits & (2**m - 1)
    bias = 2 ** (e - 1) - 1
    if exponent == 2**e - 1 and has_inf:
        return ("nan" if mantissa else ("inf" if sign > 0 else "-inf")), False
    if exponent == 2**e - 1 and mantissa == 2**m - 1:  # the fn layout: only all ones is NaN
        return "nan", False
    if exponent == 0:
        return sign * Fraction(mantissa, 2**m) * Fraction(2) ** (1 - bias), False
    return sign * (1 + Fraction(mantissa, 2**m)) * Fraction(2) ** (exponent - bias), True


def _enumerated_limits(e: int, m: int, has_inf: bool) -> dict:
    """The limits found by decoding every bit pattern of the format."""
    values = [_decode(bits, e, m, has_inf) for bits in range(2 ** (1 + e + m))]
    finite = [(v, normal) for v, normal in values if isinstance(v, Fraction)]
    return {"max": float(max(v for v, _ in finite)),
            "smallest_normal": float(min(v for v, normal in finite if normal and v > 0)),
            "smallest_subnormal": float(min(v for v, _ in finite if v > 0)),
            "eps": float(min(v for v, _ in finite if v > 1) - 1)}


def widths(low, high):
    """A bit width from low to high, as an int or as an integral float (a count: 8.0 is 8 bits)."""
    return st.integers(low, high).flatmap(lambda n: st.sampled_from([n, float(n)]))


small_formats = st.tuples(widths(2, 5), widths(1, 5), st.booleans())
SMALL_FORMATS = [(2, 1, True), (2, 1, False), (4, 3, False), (5, 2, True), (3, 5, False), (5, 5, True),
                 (3.0, 2.0, True)]


@pytest.mark.points(2)
@settings(max_examples=5)
@given(cases=st.lists(small_formats, min_size=1, max_size=6))
@example(cases=SMALL_FORMATS)
def test_format_limits_match_every_bit_pattern(cases):
    got = run("ex06", _limits_driver, cases, timeout=TIMEOUT)
    for (e, m, has_inf), result in zip(cases, got):
        _check_limits(result, _enumerated_limits(int(e), int(m), has_inf), _call(e, m, has_inf),
                      "from decoding every bit pattern of the format")


# True is 1 to isinstance(..., int) and 1 mantissa bit is in range: only a bool check refuses format_limits(8, True).
BAD_FORMATS = [((1, 3, True), "exponent_bits"), ((12, 3, True), "exponent_bits"), ((True, 3, True), "exponent_bits"),
               ((5.5, 3, True), "exponent_bits"), (("8", 23, True), "exponent_bits"), ((8, 0, True), "mantissa_bits"),
               ((8, 53, True), "mantissa_bits"), ((8, False, True), "mantissa_bits"), ((8, 2.5, True), "mantissa_bits"),
               ((8, True, True), "mantissa_bits"), ((math.nan, 3, True), "exponent_bits"),
               ((8, math.inf, True), "mantissa_bits"), ((12.0, 3, True), "exponent_bits"),
               ((4, 3, "no"), "has_inf"), ((4, 3, None), "has_inf"), ((4, 3, 1), "has_inf")]

# Widths that are no count of bits in range, by kind: a bool (True is 1 to isinstance(..., int), and 1 mantissa bit
# is in range), a fractional float, nan or inf, a whole number out of range (as an int or an integral float), a string.
BAD_WIDTHS = {
    "bool": lambda low: st.just(True) if low == 1 else st.booleans(),
    "fraction": lambda low: st.floats(-100, 100).filter(lambda v: not v.is_integer()),
    "not finite": lambda low: st.sampled_from([math.nan, math.inf, -math.inf]),
    "out of range": lambda low: (st.integers(-3, low - 1) | st.integers(53 if low == 1 else 12, 70)).flatmap(
        lambda n: st.sampled_from([n, float(n)])),
    "not a number": lambda low: st.sampled_from(["8", None, b"8", [8]]),
}


@st.composite
def bad_format_calls(draw):
    """format_limits(e, m, has_inf=...) calls with exactly one argument wrong, one of each kind for each argument."""
    calls = []
    for broken in ("exponent_bits", "mantissa_bits", "has_inf"):
        for kind in (BAD_WIDTHS if broken != "has_inf" else [None]):
            e, m, has_inf = draw(widths(2, 10)), draw(widths(1, 52)), draw(st.booleans())
            if broken == "has_inf":
                calls.append(((e, m, draw(st.sampled_from([0, 1, "no", None, 1.0]))), broken))
            elif broken == "exponent_bits":
                calls.append(((draw(BAD_WIDTHS[kind](2)), m, has_inf), broken))
            else:
                calls.append(((e, draw(BAD_WIDTHS[kind](1)), has_inf), broken))
    return calls


def _bad_limits_driver(module, cases):
    return [exception_raised_by(module.format_limits, e, m, has_inf=has_inf) for e, m, has_inf in cases]


@pytest.mark.points(1)
@settings(max_examples=3)
@given(cases=bad_format_calls())
@example(cases=BAD_FORMATS)
def test_format_limits_rejects_bad_arguments(cases):
    got = run("ex06", _bad_limits_driver, [call for call, _ in cases], timeout=TIMEOUT)
    for ((e, m, has_inf), broken), (raised, message) in zip(cases, got):
        assert_rejects(f"format_limits({e!r}, {m!r}, has_inf={has_inf!r})", raised, message, broken)


def _any_width_driver(module, cases):
    """Per case: the four limits as floats, or [exception class name, message] (NotImplementedError propagates)."""
    _switch_off_other_limits()
    out = []
    for e, m, has_inf in cases:
        try:
            result = module.format_limits(e, m, has_inf=has_inf)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - the exception is the answer here
            out.append({"raised": [type(exc).__name__, str(exc)]})
            continue
        out.append({"raised": None, "fields": {name: float(getattr(result, name, math.nan)) for name in FIELDS}})
    return out


def _decoded_limits(e: int, m: int, has_inf: bool) -> dict:
    """Each limit as the exact value (a Fraction) of the bit pattern that holds it, decoded by _decode above."""
    top_fields = [(field << m) | mantissa for field in (2**e - 2, 2**e - 1) for mantissa in (2**m - 2, 2**m - 1)
                  if mantissa >= 0]
    finite = [value for value, _ in map(lambda bits: _decode(bits, e, m, has_inf), top_fields)
              if isinstance(value, Fraction)]
    bias = 2 ** (e - 1) - 1
    return {"max": max(finite), "smallest_normal": _decode(1 << m, e, m, has_inf)[0],
            "smallest_subnormal": _decode(1, e, m, has_inf)[0],
            "eps": _decode((bias << m) | 1, e, m, has_inf)[0] - 1}


WIDE_FORMATS = [(11, 52, False), (11, 1, False), (11, 52, True), (10, 52, False), (11, 23, False), (2, 52, False)]


@pytest.mark.points(1)
@settings(max_examples=5)
@given(cases=st.lists(st.tuples(st.integers(2, 11), st.integers(1, 52), st.booleans()), min_size=1, max_size=8))
@example(cases=WIDE_FORMATS)
def test_format_limits_of_any_width_or_a_value_error(cases):
    got = run("ex06", _any_width_driver, cases, timeout=TIMEOUT)
    for (e, m, has_inf), result in zip(cases, got):
        where = _call(e, m, has_inf)
        want = _decoded_limits(e, m, has_inf)
        try:
            floats = {name: float(value) for name, value in want.items()}  # exact: at most 53 significant bits
        except OverflowError:  # the largest value does not fit a Python float: the docstring asks for a ValueError
            assert result["raised"] is not None, (
                f"{where} returned {result['fields']}, but its max, {float(want['max'] / 2**1024)!r} * 2**1024, is "
                "beyond a Python float: raise ValueError")
            kind, message = result["raised"]
            assert kind == "ValueError", (
                f"{where} must raise ValueError (its max is beyond a float), not {kind}: {message}")
            assert "has_inf" in message or "exponent_bits" in message, (
                f"{where}: the ValueError should name the argument to change (has_inf or exponent_bits) and say what "
                f"to pass; it says {message!r}")
            continue
        assert result["raised"] is None, f"{where} raised {result['raised'][0]}: {result['raised'][1]}"
        for name, value in floats.items():
            assert result["fields"][name] == value, (
                f"{where}.{name} should be {value!r} (the bit pattern that holds it, decoded exactly), "
                f"got {result['fields'][name]!r}")


# ---------------------------------------------------------------- round_to_bfloat16


def _refuse_bfloat16_conversions():
    """A TorchDispatchMode that refuses every way torch converts values to bfloat16 (it sees every operator).

    An operator that produces a bfloat16 tensor is refused if it reads a tensor of another dtype (other than
    bool: a torch.where mask), takes a Python float that bfloat16 cannot hold as it is, or lifts a constant
    made by torch.tensor(..., dtype=torch.bfloat16). .view(torch.bfloat16) only reinterprets bits: allowed.
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    aten = getattr(torch, "ops").aten  # not torch.ops.aten: cloudpickle would try to ship torch.ops by value
    allowed = {aten.view.dtype}
    lifts = {aten.lift_fresh.default, aten.lift_fresh_copy.default, aten.lift.default}

    def exact_in_bfloat16(value: float) -> bool:
        """Whether bfloat16 holds this Python float as it is (a constant like 0.0, -2.0 or nan, not a rounding)."""
        if not math.isfinite(value):
            return True
        try:
            bits = struct.unpack("<I", struct.pack("<f", value))[0]
        except OverflowError:
            return False
        return bits & 0xFFFF == 0 and struct.unpack("<f", struct.pack("<I", bits))[0] == value

    class NoBfloat16Conversions(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            return False  # the default wraps __torch_dispatch__ with torch._dynamo, whose import takes seconds

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func in allowed:
                return out
            makes = any(isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 for t in tree_leaves(out))
            if makes:
                leaves = tree_leaves((args, kwargs))
                reads = [t.dtype for t in leaves if isinstance(t, torch.Tensor)
                         and t.dtype not in (torch.bfloat16, torch.bool)]
                floats = [v for v in leaves if isinstance(v, float) and not exact_in_bfloat16(v)]
                if func in lifts or reads or floats:
                    raise RuntimeError(
                        f"round_to_bfloat16 must round the bits itself: torch's conversions to bfloat16 are switched "
                        f"off while it runs ({func} made a bfloat16 tensor from "
                        f"{reads[0] if reads else (repr(floats[0]) if floats else 'a constant')}); compute the 16 bits "
                        f"with integer arithmetic on x.view(torch.int32), then .to(torch.int16).view(torch.bfloat16)")
            return out

    return NoBfloat16Conversions()


def _signed32(bits: int) -> int:
    return bits - 2**32 if bits >= 2**31 else bits


def _float32_input(case):
    """(x, base): the float32 tensor passed in, with case["bits"] as values, and the tensor whose memory it views."""
    shape, layout = tuple(case["shape"]), case["layout"]
    values = torch.tensor([_signed32(b) for b in case["bits"]], dtype=torch.int32).reshape(shape)
    if layout == "transposed":  # the same values, laid out with the last two dimensions swapped
        base = values.transpose(-1, -2).contiguous()
        return base.view(torch.float32).transpose(-1, -2), base.view(torch.float32)
    if layout == "every other row":  # rows 0, 2, 4, ... of a tensor twice as long, a NaN with a low payload between
        base = torch.full((2 * shape[0],) + shape[1:], 0x7F800001, dtype=torch.int32)
        base[::2] = values
        return base.view(torch.float32)[::2], base.view(torch.float32)
    base = values.clone()
    return base.view(torch.float32), base.view(torch.float32)


def _round_driver(module, cases):
    out = []
    for case in cases:
        x, base = _float32_input(case)
        before = base.view(torch.int32).clone()
        with _refuse_bfloat16_conversions():
            result = module.round_to_bfloat16(x)
        info = {"type": "Tensor" if type(result) is torch.Tensor else _type_name(result),
                "unchanged": torch.equal(base.view(torch.int32), before)}
        if isinstance(result, torch.Tensor):
            info.update(dtype=str(result.dtype), shape=list(result.shape), shares=_same_memory(result, base))
            if result.dtype == torch.bfloat16:
                info["bits"] = result.detach().view(torch.int16).clone()
        out.append(info)
    return out


def _hex16(bits: int) -> str:
    return f"0x{bits & 0xFFFF:04X}"


def _bf16_value(bits: int) -> str:
    return repr(torch.tensor([_signed16(bits)], dtype=torch.int16).view(torch.bfloat16).item())


def _signed16(bits: int) -> int:
    bits &= 0xFFFF
    return bits - 2**16 if bits >= 2**15 else bits


def _why(bits: int, want: int, got: int) -> str:
    """What the usual mistake is, for a float32 pattern rounded wrongly."""
    low, exponent = bits & 0xFFFF, (bits >> 23) & 0xFF
    if exponent == 0xFF and bits & 0x7FFFFF:
        return "a NaN must stay a NaN: leave NaNs out of the rounding (return 0x7FC0, say)"
    if low == 0x8000:
        return "a tie (low half exactly 0x8000): round to the neighbour whose last kept bit is 0 (ties to even)"
    if (got & 0xFFFF) == (bits >> 16):
        return "that is truncation: round to nearest (add 0x7FFF plus the last kept bit before shifting)"
    return "round to nearest, ties to even, on the unsigned bit pattern"


def _check_rounding(case, result, where):
    values = torch.tensor([_signed32(b) for b in case["bits"]], dtype=torch.int32).view(torch.float32)
    assert result["type"] == "Tensor", f"{where}: return a torch.Tensor, got {result['type']}"
    assert result["dtype"] == "torch.bfloat16", f"{where}: return a torch.bfloat16 tensor, got {result['dtype']}"
    assert result["shape"] == list(case["shape"]), (
        f"{where}: the result must have x's shape {list(case['shape'])}, got {result['shape']}")
    want = values.to(torch.bfloat16).view(torch.int16).tolist()
    got = result["bits"].reshape(-1).tolist()
    for index, (bits, w, g) in enumerate(zip(case["bits"], want, got)):
        value = values[index].item()
        if math.isnan(value):
            ok = (g & 0x7F80) == 0x7F80 and (g & 0x7F) != 0
        else:
            ok = (g & 0xFFFF) == (w & 0xFFFF)
        should = ("must stay a NaN in bfloat16 (any NaN: exponent bits all ones, mantissa not 0)" if math.isnan(value)
                  else f"rounds to bfloat16 {_hex16(w)} ({_bf16_value(w)}), as x.to(torch.bfloat16) gives")
        assert ok, (f"{where}: the float32 {value!r} (bits 0x{bits:08X}) {should}; got {_hex16(g)} ({_bf16_value(g)}): "
                    f"{_why(bits, w, g)}")
    assert result["unchanged"], f"{where}: x was changed; leave the input as it was"
    assert not result["shares"], f"{where}: the result shares memory with x; return a new tensor"


# float32 bit patterns, field by field: the kept 7 mantissa bits, and the dropped low half around the tie.
_sign = st.sampled_from([0, 0x80000000])
_exponent = st.sampled_from([0, 1, 0x7F, 0x80, 0xFE, 0xFF]) | st.integers(0, 0xFF)
_kept = st.sampled_from([0, 1, 0x7E, 0x7F]) | st.integers(0, 0x7F)
_dropped = st.sampled_from([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF]) | st.integers(0, 0xFFFF)
float32_bits = st.builds(lambda s, e, k, d: s | e << 23 | k << 16 | d, _sign, _exponent, _kept, _dropped)

SPECIAL_BITS = [
    0x3F808000, 0x3F818000,  # ties: 1.00390625 stays 1.0 (even), 1.01171875 goes up to 1.015625
    0xBF808000, 0xBF818000,  # the same, negative
    0x3F807FFF, 0x3F808001, 0x3F80FFFF,  # just below, just above a tie, and a carry into the next value
    0x3FFFFFFF, 0x3FFF8000,  # 1.99999... and a tie that carries into the exponent: 2.0
    0x7F7FFFFF, 0x7F7F8000, 0xFF7FFFFF, 0x7F7F7FFF,  # the largest float32s round to ±inf; just below a tie does not
    0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # ±0, ±inf
    0x7FC00000, 0x7F800001, 0xFF800001, 0x7F80FFFF, 0x7FFFFFFF, 0xFFFFFFFF,  # NaNs, some with only low payload bits
    0x00000001, 0x00008000, 0x00018000, 0x0000FFFF, 0x007FFFFF, 0x807F8000,  # subnormals, their ties and carries
]


@st.composite
def rounding_cases(draw):
    ndim = draw(st.integers(0, 3))
    shape = draw(st.lists(st.integers(0, 4) if ndim > 1 else st.integers(0, 12), min_size=ndim, max_size=ndim))
    layouts = ["contiguous"] + (["every other row"] if ndim >= 1 else []) + (["transposed"] if ndim >= 2 else [])
    numel = math.prod(shape)
    return {"bits": draw(st.lists(float32_bits, min_size=numel, max_size=numel)), "shape": shape,
            "layout": draw(st.sampled_from(layouts))}


def _layout_name(case):
    return f"x of shape {tuple(case['shape'])} ({case['layout']})"


ROUNDING_CASES = [{"bits": SPECIAL_BITS, "shape": [len(SPECIAL_BITS)], "layout": "contiguous"},
                  {"bits": SPECIAL_BITS[:24], "shape": [4, 6], "layout": "transposed"}]


@pytest.mark.points(3)
@settings(max_examples=6)
@given(cases=st.lists(st.builds(lambda bits: {"bits": bits, "shape": [len(bits)], "layout": "contiguous"},
                                st.lists(float32_bits, min_size=1, max_size=40)), min_size=1, max_size=5))
@example(cases=ROUNDING_CASES)
def test_round_to_bfloat16_matches_torch_bit_for_bit(cases):
    got = run("ex06", _round_driver, cases, timeout=TIMEOUT)
    for case, result in zip(cases, got):
        _check_rounding(case, result, f"round_to_bfloat16 on {_layout_name(case)}")


SHAPE_CASES = [{"bits": [0x3F808000], "shape": [], "layout": "contiguous"},
               {"bits": [], "shape": [0], "layout": "contiguous"},
               {"bits": [], "shape": [3, 0, 2], "layout": "transposed"},
               {"bits": SPECIAL_BITS[:12], "shape": [3, 4], "layout": "every other row"},
               {"bits": (SPECIAL_BITS * 2)[5:29], "shape": [2, 3, 4], "layout": "transposed"}]


@pytest.mark.points(2)
@settings(max_examples=5)
@given(cases=st.lists(rounding_cases(), min_size=1, max_size=5))
@example(cases=SHAPE_CASES)
def test_round_to_bfloat16_keeps_any_shape_and_layout(cases):
    got = run("ex06", _round_driver, cases, timeout=TIMEOUT)
    for case, result in zip(cases, got):
        _check_rounding(case, result, f"round_to_bfloat16 on {_layout_name(case)}")


def _bad_round_driver(module, names):
    values = {"float64": torch.ones(3, dtype=torch.float64), "float16": torch.ones(3, dtype=torch.float16),
              "bfloat16": torch.ones(3, dtype=torch.bfloat16), "int32": torch.ones(3, dtype=torch.int32),
              "a list": [1.0, 2.0], "a float": 1.5}
    return [exception_raised_by(module.round_to_bfloat16, values[name]) for name in names]


@pytest.mark.points(1)
def test_round_to_bfloat16_rejects_other_dtypes():
    names = ["float64", "float16", "bfloat16", "int32", "a list", "a float"]
    got = run("ex06", _bad_round_driver, names, timeout=TIMEOUT)
    for name, (raised, message) in zip(names, got):
        assert raised == "TypeError", (
            f"round_to_bfloat16 on {name if name.startswith('a ') else 'a ' + name + ' tensor'} must raise TypeError "
            f"saying to pass a float32 tensor, not {raised} {message}")
        assert "float32" in message, f"round_to_bfloat16's TypeError should say to pass a float32 tensor: {message!r}"


# ---------------------------------------------------------------- DynamicLossScaler


class TaggedSGD(torch.optim.SGD):
    """SGD whose step() counts its calls and returns the tag it is given (to see what scaler.step returns)."""

    def step(self, closure=None, tag=None):
        self.taken = getattr(self, "taken", 0) + 1
        super().step(closure)
        return tag


class TaggedAdam(torch.optim.Adam):
    """Adam whose step() counts its calls and returns the tag it is given."""

    def step(self, closure=None, tag=None):
        self.taken = getattr(self, "taken", 0) + 1
        super().step(closure)
        return tag


PLANTED = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _scaler_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _scaler_training(make_scaler, case, switch_at=None, make_next=None):
    """Train case["steps"] steps with a loss scaler; what happened at each step, as plain data.

    make_scaler(case) makes the scaler; at step switch_at, make_next(scaler) replaces it (a state_dict round trip).
    Gradients listed in case["plants"] get an inf, -inf or NaN after backward; case["unscale"][step] says
    whether unscale_ is called by hand before step.
    """
    model = _scaler_model(case["seed"])
    params = list(model.parameters())
    groups = [params[:2], params[2:]] if case["optimizers"] == 2 else [params]
    optimizers = [TaggedAdam(group, lr=0.01) if case["optimizer"] == "adam" else
                  TaggedSGD(group, lr=0.1, momentum=0.9) for group in groups]
    scaler = make_scaler(case)
    generator = torch.Generator().manual_seed(case["seed"])
    log = []
    for step in range(case["steps"]):
        if step == switch_at:
            scaler = make_next(scaler)
        x, y = torch.randn(4, 6, generator=generator), torch.randn(4, 3, generator=generator)
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        scaled = scaler.scale(loss)
        scaled.backward()
        with torch.no_grad():
            for planted_step, which, index, kind in case["plants"]:
                if planted_step == step:
                    grad = params[which].grad.view(-1)
                    grad[index % grad.numel()] = PLANTED[kind]
        if case["unscale"][step]:
            for optimizer in optimizers:
                scaler.unscale_(optimizer)
        returned = [scaler.step(optimizer, tag=f"step {step}") for optimizer in optimizers]
        scaler.update()
        scale = scaler.get_scale()
        state = scaler.state_dict()
        log.append({"scaled": [_type_name(scaled), float(scaled.detach()) if isinstance(scaled, torch.Tensor) else None,
                               float(loss.detach())],
                    "scale": [_type_name(scale), float(scale)], "returned": returned,
                    "taken": [getattr(optimizer, "taken", 0) for optimizer in optimizers],
                    "params": [p.detach().clone() for p in params],
                    "state": {key: [_type_name(value), value if isinstance(value, (int, float)) else None]
                              for key, value in state.items()}})
    return log


def _switch_off_torch_scaler():
    """torch's GradScaler (every name it goes by) and the two operators it is built on refuse to run."""
    import torch.amp.grad_scaler as grad_scaler

    original = grad_scaler.GradScaler
    message = ("torch's GradScaler is switched off while DynamicLossScaler is tested: build it from plain Python and "
               "tensor operations (torch.isfinite, mul_)")

    class Refused:
        def __init__(self, *args, **kwargs):
            raise RuntimeError(message)

    def refused(*args, **kwargs):
        raise RuntimeError(message)

    owners = [torch.amp, grad_scaler, torch.cpu.amp, torch.cuda.amp]
    for name in ("torch.cpu.amp.grad_scaler", "torch.cuda.amp.grad_scaler"):
        try:
            owners.append(__import__(name, fromlist=["GradScaler"]))
        except ImportError:
            pass
    for owner in owners:
        if hasattr(owner, "GradScaler"):
            owner.GradScaler = Refused
    torch._amp_update_scale_ = torch._amp_foreach_non_finite_check_and_unscale_ = refused
    return original


def _refuse_subclass(module, original):
    if isinstance(module.DynamicLossScaler, type) and issubclass(module.DynamicLossScaler, original):
        raise RuntimeError("DynamicLossScaler must not subclass torch's GradScaler (switched off while it is tested): "
                           "build it from plain Python and tensor operations")


def _learner_scaler(module, original):
    def make(case):
        _refuse_subclass(module, original)
        return module.DynamicLossScaler(init_scale=case["init_scale"], growth_factor=case["growth_factor"],
                                        backoff_factor=case["backoff_factor"], growth_interval=case["growth_interval"])
    return make


def _torch_scaler(case):
    return torch.amp.GradScaler("cpu", init_scale=case["init_scale"], growth_factor=case["growth_factor"],
                                backoff_factor=case["backoff_factor"], growth_interval=case["growth_interval"])


def _scaler_driver(module, cases):
    original = _switch_off_torch_scaler()
    return [_scaler_training(_learner_scaler(module, original), case) for case in cases]


def _story(case, reference, upto):
    """What happened in the reference run up to a step, one short line each: the planted values, skips, scales."""
    lines = []
    for step in range(upto + 1):
        plants = [f"{kind} in grad of parameter {which}" for s, which, _, kind in case["plants"] if s == step]
        skipped = [i for i, r in enumerate(reference[step]["returned"]) if r is None]
        lines.append(f"  step {step}: {', '.join(plants) or 'finite gradients'}"
                     f"{', unscale_ by hand' if case['unscale'][step] else ''}"
                     f"{' -> skipped' if skipped else ''}, scale after update() {reference[step]['scale'][1]!r}")
    return "\n".join(lines)


def _describe_scaler_case(case):
    return (f"DynamicLossScaler(init_scale={case['init_scale']!r}, growth_factor={case['growth_factor']!r}, "
            f"backoff_factor={case['backoff_factor']!r}, growth_interval={case['growth_interval']}) with "
            f"{'two optimizers' if case['optimizers'] == 2 else 'one optimizer'} "
            f"({'Adam' if case['optimizer'] == 'adam' else 'SGD with momentum'})")


def _check_scaler_run(case, mine, reference, where):
    for step, (got, want) in enumerate(zip(mine, reference)):
        at = f"{where}, step {step}"
        history = f"\ntorch.amp.GradScaler's run:\n{_story(case, reference, step)}"
        kind, scaled, loss = got["scaled"]
        assert kind == "Tensor", f"{at}: scale(loss) must return a tensor (loss times the scale), got a {kind}"
        scale_before = reference[step - 1]["scale"][1] if step else case["init_scale"]
        assert scaled == pytest.approx(want["scaled"][1], rel=1e-6, nan_ok=True), (
            f"{at}: scale(loss) should be loss * scale = {loss!r} * {scale_before!r} = {want['scaled'][1]!r}, got "
            f"{scaled!r}{history}")
        assert got["scale"][0] == "float", f"{at}: get_scale() must return a Python float, got a {got['scale'][0]}"
        skipped = [r is None for r in want["returned"]]
        assert [r is None for r in got["returned"]] == skipped and got["taken"] == want["taken"], (
            f"{at}: optimizer.step() should have been {'skipped' if any(skipped) else 'taken'} "
            f"({'an inf or NaN gradient' if any(skipped) else 'every gradient finite'}), and scaler.step return "
            f"None when it skips, optimizer.step's value otherwise ({want['returned']}); got {got['returned']}, and "
            f"optimizer steps taken so far {got['taken']} where torch's GradScaler took {want['taken']}{history}")
        assert got["returned"] == want["returned"], (
            f"{at}: scaler.step(optimizer, *args, **kwargs) must return what optimizer.step(*args, **kwargs) returned "
            f"({want['returned']}), got {got['returned']}")
        assert got["scale"][1] == pytest.approx(want["scale"][1], rel=1e-6), (
            f"{at}: the scale after update() should be {want['scale'][1]!r}, got {got['scale'][1]!r} (back off once "
            f"per update() when any gradient was inf or NaN, and reset the growth tracker; grow after growth_interval "
            f"good steps in a row){history}")
        for index, (param, ref) in enumerate(zip(got["params"], want["params"])):
            torch.testing.assert_close(param, ref, rtol=1e-6, atol=1e-6, equal_nan=True, msg=lambda m: (
                f"{at}: parameter {index} after the step differs from the same training with torch.amp.GradScaler "
                f"(divide each gradient by the scale before optimizer.step, once){history}\n{m}"))


@st.composite
def scaler_cases(draw, optimizer="sgd", optimizers=1):
    steps = draw(st.integers(6, 12))
    plants = draw(st.lists(st.tuples(st.integers(0, steps - 1), st.integers(0, 3), st.integers(0, 47),
                                     st.sampled_from(sorted(PLANTED))), max_size=6))
    return {"seed": draw(st.integers(0, 10**4)), "steps": steps, "plants": plants,
            "unscale": draw(st.lists(st.booleans(), min_size=steps, max_size=steps)),
            "init_scale": draw(st.sampled_from([2.0**16, 1.0, 0.125, 1024.0, 3000.0])),
            "growth_factor": draw(st.sampled_from([2.0, 4.0, 1.5])),
            "backoff_factor": draw(st.sampled_from([0.5, 0.25, 0.75])),
            "growth_interval": draw(st.integers(1, 4)), "optimizer": optimizer, "optimizers": optimizers}


def scaler_case(steps, plants, unscale=(), init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=3,
                optimizer="sgd", optimizers=1, seed=0):
    return {"seed": seed, "steps": steps, "plants": [list(p) for p in plants],
            "unscale": [step in unscale for step in range(steps)], "init_scale": init_scale,
            "growth_factor": growth_factor, "backoff_factor": backoff_factor, "growth_interval": growth_interval,
            "optimizer": optimizer, "optimizers": optimizers}


# Always run: growth after 3 good steps, an inf that resets the tracker, two infs in one step (one backoff),
# a NaN and a -inf, some steps unscaled by hand and some not; a factor that is not a power of 2.
SCALER_CASES = [
    scaler_case(10, [(2, 0, 5, "inf"), (6, 1, 0, "nan"), (6, 3, 2, "-inf"), (7, 2, 11, "nan")], unscale={1, 3, 6, 8}),
    scaler_case(8, [(0, 2, 3, "inf"), (4, 0, 0, "-inf")], init_scale=3000.0, growth_factor=1.5,
                backoff_factor=0.25, growth_interval=1, unscale={0, 1, 5}, seed=1),
]


@pytest.mark.points(4)
@settings(max_examples=4)
@given(cases=st.lists(scaler_cases(), min_size=1, max_size=3))
@example(cases=SCALER_CASES)
def test_loss_scaler_matches_grad_scaler_step_for_step(cases):
    got = run("ex06", _scaler_driver, cases, timeout=TIMEOUT)
    for case, mine in zip(cases, got):
        _check_scaler_run(case, mine, _scaler_training(_torch_scaler, case), _describe_scaler_case(case))


# Adam; two optimizers, an inf in one optimizer's gradients only (the other still steps, the scale backs off
# once); infs in both optimizers' gradients in the same step (still one backoff).
OPTIMIZER_CASES = [
    scaler_case(8, [(1, 1, 4, "nan"), (5, 3, 0, "inf")], optimizer="adam", growth_interval=2, unscale={2, 5}, seed=2),
    scaler_case(8, [(1, 0, 7, "inf"), (4, 3, 1, "nan"), (6, 1, 2, "-inf"), (6, 2, 0, "inf")], optimizers=2,
                growth_interval=2, unscale={4, 6}, seed=3),
    scaler_case(6, [(0, 0, 1, "inf"), (0, 2, 1, "inf"), (3, 2, 5, "nan")], optimizer="adam", optimizers=2,
                growth_interval=1, growth_factor=4.0, unscale={0}, seed=4),
]


@pytest.mark.points(2)
def test_loss_scaler_with_adam_and_two_optimizers():
    got = run("ex06", _scaler_driver, OPTIMIZER_CASES, timeout=TIMEOUT)
    for case, mine in zip(OPTIMIZER_CASES, got):
        _check_scaler_run(case, mine, _scaler_training(_torch_scaler, case), _describe_scaler_case(case))


def _unscale_driver(module):
    _refuse_subclass(module, _switch_off_torch_scaler())
    model = _scaler_model(5)
    unused = torch.nn.Parameter(torch.zeros(3))  # never in the loss: its .grad stays None, and unscale_ skips it
    optimizer = TaggedSGD([*model.parameters(), unused], lr=0.1)
    scaler = module.DynamicLossScaler(init_scale=1024.0)
    x, y = torch.randn(4, 6, generator=torch.Generator().manual_seed(5)), torch.zeros(4, 3)
    loss = F.mse_loss(model(x), y)
    loss_before = loss.detach().clone()
    scaled = scaler.scale(loss)
    scaled.backward()
    grads = [p.grad for p in model.parameters()]
    scaled_grads = [g.clone() for g in grads]
    pointers = [g.data_ptr() for g in grads]
    first = exception_raised_by(scaler.unscale_, optimizer)
    unscaled = [p.grad.clone() for p in model.parameters()]
    in_place = all(p.grad is g and p.grad.data_ptr() == ptr for p, g, ptr in zip(model.parameters(), grads, pointers))
    second = exception_raised_by(scaler.unscale_, optimizer)
    stepped = scaler.step(optimizer, tag="stepped")
    after_step = exception_raised_by(scaler.unscale_, optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(F.mse_loss(model(x), y)).backward()
    next_iteration = exception_raised_by(scaler.unscale_, optimizer)
    return {"same_object": scaled is loss, "loss_unchanged": torch.equal(loss.detach(), loss_before),
            "unused_grad": repr(unused.grad),
            "requires_grad": bool(getattr(scaled, "requires_grad", False)), "scaled_grads": scaled_grads,
            "unscaled": unscaled, "in_place": in_place, "first": first, "second": second, "stepped": stepped,
            "after_step": after_step, "next_iteration": next_iteration}


@pytest.mark.points(2)
def test_loss_scaler_unscales_in_place_once_per_step():
    got = run("ex06", _unscale_driver, timeout=TIMEOUT)
    where = "DynamicLossScaler(init_scale=1024.0)"
    assert not got["same_object"] and got["loss_unchanged"], (
        f"{where}: scale(loss) must return a new tensor, loss unchanged")
    assert got["requires_grad"], f"{where}: scale(loss) must keep the graph (loss * scale), so that backward works"
    assert got["first"] == ["returned", ""], f"{where}: the first unscale_(optimizer) raised {got['first']}"
    for index, (scaled, unscaled) in enumerate(zip(got["scaled_grads"], got["unscaled"])):
        torch.testing.assert_close(unscaled, scaled / 1024.0, rtol=0, atol=0, msg=lambda m: (
            f"{where}: after unscale_, parameter {index}'s gradient should be the scaled one divided by 1024\n{m}"))
    assert got["in_place"], f"{where}: unscale_ must divide each param.grad in place (the same tensor), not replace it"
    assert got["unused_grad"] == "None", (
        f"{where}: a parameter that took no part in the loss has .grad None; unscale_ must skip it and leave it None, "
        f"got {got['unused_grad']}")
    raised, message = got["second"]
    text = "unscale_() has already been called on this optimizer since the last update()"
    assert raised == "RuntimeError" and text in message, (
        f"{where}: a second unscale_(optimizer) before update() must raise RuntimeError(\"unscale_() has already been "
        f"called on this optimizer since the last update().\"), as torch's GradScaler does; "
        + ("it returned without raising" if raised == "returned" else f"got {raised} {message!r}"))
    assert got["stepped"] == "stepped", (
        f"{where}: step(optimizer, tag=...) after unscale_ must call optimizer.step(tag=...) once, without dividing "
        f"again, and return its value; got {got['stepped']!r}")
    assert got["after_step"][0] == "RuntimeError" and "after step()" in got["after_step"][1], (
        f"{where}: unscale_(optimizer) after step() and before update() must raise RuntimeError (\"unscale_() is being "
        f"called after step().\"), got {got['after_step']}")
    assert got["next_iteration"] == ["returned", ""], (
        f"{where}: after update(), a new iteration may call unscale_ again; it raised {got['next_iteration']}")


def _state_driver(module, cases):
    original = _switch_off_torch_scaler()
    out = []
    for case, switch_at, torch_state in cases:
        def from_state(state):
            def make_next(scaler):
                fresh = module.DynamicLossScaler()
                given_state = dict(state if state is not None else scaler.state_dict())
                fresh.load_state_dict(given_state)
                given_state.update(scale=-1.0, _growth_tracker=99)  # a scaler keeps no reference to the dict
                return fresh
            return make_next

        make = _learner_scaler(module, original)
        out.append({"own": _scaler_training(make, case, switch_at, from_state(None)),
                    "from_torch": _scaler_training(make, case, switch_at, from_state(torch_state))})
    # what a disabled GradScaler saves is {}: refused, and the scaler stays as it was
    scaler = module.DynamicLossScaler(init_scale=8.0, growth_interval=3)
    empty = exception_raised_by(scaler.load_state_dict, {})
    return out, [*empty, scaler.state_dict()]


STATE_KEYS = ["_growth_tracker", "backoff_factor", "growth_factor", "growth_interval", "scale"]
STATE_CASES = [(scaler_case(9, [(1, 0, 2, "inf"), (5, 3, 1, "nan")], init_scale=512.0, growth_factor=4.0,
                            backoff_factor=0.25, growth_interval=3, unscale={2, 7}, seed=6), 4),
               (scaler_case(7, [(3, 1, 0, "-inf")], growth_interval=2, seed=7), 3)]


def _plain_state(logged):
    return {key: value for key, (_, value) in logged.items()}


@pytest.mark.points(2)
def test_loss_scaler_state_dict_round_trips_with_torch():
    references = [_scaler_training(_torch_scaler, case) for case, _ in STATE_CASES]
    sent = [(case, at, _plain_state(reference[at - 1]["state"]))
            for (case, at), reference in zip(STATE_CASES, references)]
    got, empty = run("ex06", _state_driver, sent, timeout=TIMEOUT)
    torch_empty = exception_raised_by(torch.amp.GradScaler("cpu").load_state_dict, {})
    assert empty[0] == torch_empty[0] == "RuntimeError" and "empty" in empty[1], (
        f"DynamicLossScaler.load_state_dict({{}}) must raise RuntimeError(\"{torch_empty[1]}\"), as torch's "
        f"GradScaler does (a disabled GradScaler saves an empty dict); got {empty[:2]}")
    want = {"scale": 8.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3, "_growth_tracker": 0}
    assert empty[2] == want, (
        f"load_state_dict({{}}) that raises must leave the scaler as it was, {want}; got {empty[2]}")
    for (case, at), reference, result in zip(STATE_CASES, references, got):
        where = _describe_scaler_case(case)
        for step, (mine, want) in enumerate(zip(result["own"], reference)):
            if step == at:
                continue  # the run switched scalers here; its steps are compared below
            state = mine["state"]
            assert sorted(state) == STATE_KEYS, (
                f"{where}, step {step}: state_dict() must have torch's GradScaler keys {STATE_KEYS}, got "
                f"{sorted(state)}")
            for key in STATE_KEYS:
                kind, value = state[key]
                want_kind, want_value = want["state"][key]
                assert kind == want_kind, (
                    f"{where}, step {step}: state_dict()[{key!r}] must be a {want_kind}, got a {kind}")
                assert value == pytest.approx(want_value, rel=1e-6), (
                    f"{where}, after step {step}: state_dict()[{key!r}] should be {want_value!r}, as torch's "
                    f"GradScaler says, got {value!r}")
        _check_scaler_run(case, result["own"], reference,
                          f"{where}, replaced at step {at} by DynamicLossScaler() loading its state_dict()")
        _check_scaler_run(case, result["from_torch"], reference,
                          f"{where}, replaced at step {at} by DynamicLossScaler() loading torch's GradScaler's "
                          f"state_dict() {_plain_state(reference[at - 1]['state'])}")
        # ... and the other way: torch's GradScaler, loading the learner's state_dict, carries on as if uninterrupted
        learner_state = _plain_state(result["own"][at - 1]["state"])

        def into_torch(scaler, learner_state=learner_state):
            fresh = torch.amp.GradScaler("cpu")
            fresh.load_state_dict(learner_state)
            return fresh

        carried = _scaler_training(_torch_scaler, case, at, into_torch)
        for step in range(at, case["steps"]):
            assert carried[step]["scale"] == reference[step]["scale"], (
                f"{where}: torch's GradScaler loading your state_dict() {learner_state} at step {at} carries on "
                f"differently: scale {carried[step]['scale'][1]!r} after step {step}, not "
                f"{reference[step]['scale'][1]!r}")


# ---- at float32's limits: scales up to 2**127 and down to 0, gradients up to float32's max whose sums overflow

FLOAT32_MAX = 3.4028234663852886e38
LOSS_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


class UnhashableSGD(TaggedSGD):
    """An optimizer that cannot be a dict key (it defines == without a hash): key the records by id(optimizer)."""

    def __eq__(self, other):
        return self is other

    __hash__ = None


def _edge_scaler_run(make_scaler, case):
    """Steps whose gradients are set directly to case["grads"] (scaled values, as backward would leave them).

    Per step: the loss case["losses"][step] = [dtype, 0-d or 1-d, value] is scaled; each parameter's .grad is set
    (None where the case says so; the first parameter always has one); unscale_ by hand or not; step; update.
    After the last step, update() once more with nothing recorded since the previous one.
    """
    params = [nn.Parameter(torch.zeros(size)) for size in EDGE_SIZES]
    optimizer = UnhashableSGD(params, lr=0.5)
    fresh = exception_raised_by(make_scaler(case).update)  # nothing recorded since the start
    scaler = make_scaler(case)
    log = []
    for step, grads in enumerate(case["grads"]):
        dtype, one_d, value = case["losses"][step]
        loss = torch.tensor([value] if one_d else value, dtype=LOSS_DTYPES[dtype], requires_grad=True)
        before = loss.detach().clone()
        scaled = scaler.scale(loss)
        for param, grad in zip(params, grads):
            param.grad = None if grad is None else torch.tensor(grad, dtype=torch.float32)
        if case["unscale"][step]:
            scaler.unscale_(optimizer)
        returned = scaler.step(optimizer, tag=f"step {step}")
        unscaled = [None if param.grad is None else param.grad.clone() for param in params]
        scaler.update()
        state = scaler.state_dict()
        log.append({"scaled": [str(scaled.dtype), scaled.detach().double().reshape(-1).tolist(), scaled is loss,
                               torch.equal(loss.detach(), before) or bool(before.isnan().all())],
                    "returned": returned, "taken": getattr(optimizer, "taken", 0), "unscaled": unscaled,
                    "params": [param.detach().clone() for param in params],
                    "scale": [_type_name(scaler.get_scale()), float(scaler.get_scale())],
                    "tracker": state.get("_growth_tracker")})
    again = exception_raised_by(scaler.update)
    return {"steps": log, "again": again, "fresh": fresh, "scale_after": float(scaler.get_scale()),
            "tracker_after": scaler.state_dict().get("_growth_tracker")}


def _edge_torch_scaler(case):
    return torch.amp.GradScaler("cpu", init_scale=case["init_scale"], growth_factor=case["growth_factor"],
                                backoff_factor=case["backoff_factor"], growth_interval=int(case["growth_interval"]))


def _edge_scaler_driver(module, cases):
    original = _switch_off_torch_scaler()
    return [_edge_scaler_run(_learner_scaler(module, original), case) for case in cases]


EDGE_SIZES = [4, 3]

# Each drawn example has one scaler starting at float32's top (powers of 2 up to 2**127, and float32's max itself:
# growing them overflows), one at the bottom (the smallest subnormals: backing off reaches 0, whose reciprocal is
# inf) and one anywhere float32 holds.
EDGE_SCALES = {
    "top": st.sampled_from([2.0**127, FLOAT32_MAX, 1.5 * 2.0**127]) | st.integers(118, 127).map(lambda k: 2.0**k),
    "bottom": st.sampled_from([2.0**-149, 2.0**-148, 2.0**-147]),
    "anywhere": st.integers(-149, 127).map(lambda k: 2.0**k) | st.floats(2.0**-149, FLOAT32_MAX, width=32)}
# A gradient entry: anything float32 holds, big ones often; inf, -inf or NaN now and then.
edge_values = (st.floats(-FLOAT32_MAX, FLOAT32_MAX, width=32) | st.floats(-4.0, 4.0, width=32)
               | st.sampled_from([2e38, -2e38, FLOAT32_MAX, -FLOAT32_MAX, 1.5e38]))


@st.composite
def edge_gradient(draw, size, may_be_none=False, nonfinite=False):
    if may_be_none and draw(st.integers(0, 4)) == 0:
        return None
    values = draw(st.lists(edge_values, min_size=size, max_size=size))
    if draw(st.booleans()):  # two or more entries of one sign (2**127 or more) whose sum overflows; each is finite
        sign = draw(st.sampled_from([1.0, -1.0]))
        for index in draw(st.permutations(range(size)))[:draw(st.integers(2, size))]:
            values[index] = sign * draw(st.floats(2.0**127, FLOAT32_MAX, width=32))
    if nonfinite:
        values[draw(st.integers(0, size - 1))] = draw(st.sampled_from([math.inf, -math.inf, math.nan]))
    return values


@st.composite
def edge_step(draw, skips):
    """One step's two gradients; in about one step of three (one of two for `skips`), an inf, -inf or NaN."""
    planted = draw(st.sampled_from([None, 0, 1] if skips else [None, None, 0, 1]))
    return [draw(edge_gradient(EDGE_SIZES[0], nonfinite=planted == 0)),
            draw(edge_gradient(EDGE_SIZES[1], may_be_none=planted != 1, nonfinite=planted == 1))]


@st.composite
def edge_scaler_cases(draw, regime="anywhere"):
    steps = draw(st.integers(3, 6))
    losses = draw(st.lists(st.tuples(st.sampled_from(sorted(LOSS_DTYPES)), st.booleans(),
                                     st.floats(-8.0, 8.0, width=16) | st.sampled_from([0.0, 2.0, 1e30, math.inf])),
                           min_size=steps, max_size=steps))
    return {"init_scale": draw(EDGE_SCALES[regime]), "growth_factor": draw(st.sampled_from([2.0, 4.0, 1.5, 1.25])),
            "backoff_factor": draw(st.sampled_from([0.5, 0.25] if regime == "bottom" else [0.5, 0.25, 0.75])),
            "growth_interval": draw(st.integers(1, 3).flatmap(lambda n: st.sampled_from([n, float(n)]))),
            "grads": draw(st.lists(edge_step(skips=regime == "bottom"), min_size=steps, max_size=steps)),
            "losses": [list(loss) for loss in losses],
            "unscale": draw(st.lists(st.booleans(), min_size=steps, max_size=steps))}


BIG = [2e38, 2e38, 2e38, 1.0]  # each finite; their sum, 6e38, overflows float32
EDGE_CASES = [
    # 2**126 grows to 2**127 and then stays (2**128 is inf); three entries of 2e38: finite, the step is taken.
    {"init_scale": 2.0**126, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 1,
     "grads": [[BIG, [1.0, 2.0, 3.0]], [[1.0, -1.0, 0.5, 2.0], None], [BIG, [-3e38, -3e38, 1.0]],
               [[1.0, math.inf, 0.0, 0.0], [1.0, 1.0, 1.0]], [BIG, None]],
     "losses": [["float32", False, 2.0], ["float16", False, 2.0], ["bfloat16", True, 3.0], ["float64", False, 0.5],
                ["float16", True, 2.0]],
     "unscale": [True, False, False, True, False]},
    # float32's max times 1.5 is inf: kept; a 0-d float16 loss scaled by it is a float32 inf, not a float16 one.
    {"init_scale": FLOAT32_MAX, "growth_factor": 1.5, "backoff_factor": 0.25, "growth_interval": 2.0,
     "grads": [[BIG, None], [[-2e38, -2e38, -2e38, -2e38], [0.0, 1.0, 2.0]], [BIG, None], [[0.5] * 4, None]],
     "losses": [["float16", False, 1e-3], ["float32", True, 1.0], ["float16", False, 0.0], ["float32", False, 1.0]],
     "unscale": [False, True, False, False]},
    # the smallest subnormal scale backs off to 0 after a NaN: its reciprocal is inf, as in torch.
    {"init_scale": 2.0**-149, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3,
     "grads": [[[math.nan, 1.0, 1.0, 1.0], None], [[1e-3, 0.0, -1.0, 2e38], [1.0, 1.0, 1.0]], [BIG, None]],
     "losses": [["float32", False, 1.0], ["float32", False, 1.0], ["bfloat16", False, 1.0]],
     "unscale": [False, True, False]},
]


def _describe_edge_case(case):
    return (f"DynamicLossScaler(init_scale={case['init_scale']!r}, growth_factor={case['growth_factor']!r}, "
            f"backoff_factor={case['backoff_factor']!r}, growth_interval={case['growth_interval']!r})")


def _edge_story(case, reference, upto):
    lines = []
    for step in range(upto + 1):
        grads = ", ".join("None" if g is None else "[" + ", ".join(f"{v:.3g}" for v in g) + "]"
                          for g in case["grads"][step])
        lines.append(f"  step {step}: scaled gradients {grads}{', unscale_ by hand' if case['unscale'][step] else ''}"
                     f"{' -> skipped' if reference['steps'][step]['returned'] is None else ''}, scale after update() "
                     f"{reference['steps'][step]['scale'][1]!r}")
    return "\n".join(lines)


def _same_values(got, want) -> bool:
    return len(got) == len(want) and all(g == w or (math.isnan(g) and math.isnan(w)) for g, w in zip(got, want))


@pytest.mark.points(3)
@settings(max_examples=4)
@given(cases=st.permutations(sorted(EDGE_SCALES)).flatmap(
    lambda regimes: st.tuples(*map(edge_scaler_cases, regimes)).map(list)))
@example(cases=EDGE_CASES)
def test_loss_scaler_at_float32_limits_matches_grad_scaler(cases):
    got = run("ex06", _edge_scaler_driver, cases, timeout=TIMEOUT)
    for case, mine in zip(cases, got):
        reference = _edge_scaler_run(_edge_torch_scaler, case)
        where = _describe_edge_case(case)
        for step, (have, want) in enumerate(zip(mine["steps"], reference["steps"])):
            at = f"{where}, step {step}"
            history = f"\ntorch.amp.GradScaler's run:\n{_edge_story(case, reference, step)}"
            dtype, one_d, value = case["losses"][step]
            call = f"scale() of a {'1-d' if one_d else '0-d'} torch.{dtype} loss {value!r}"
            assert not have["scaled"][2] and have["scaled"][3], f"{at}: {call} must return a new tensor, loss unchanged"
            assert have["scaled"][0] == want["scaled"][0] and _same_values(have["scaled"][1], want["scaled"][1]), (
                f"{at}: {call} should be {want['scaled'][1]} of {want['scaled'][0]}, as torch's GradScaler gives (loss "
                f"times the scale as a 0-d float32 tensor: type promotion decides the dtype), got {have['scaled'][1]} "
                f"of {have['scaled'][0]}{history}")
            skipped = want["returned"] is None
            assert (have["returned"] is None) == skipped and have["taken"] == want["taken"], (
                f"{at}: optimizer.step() should have been {'skipped' if skipped else 'taken'}: "
                + ("a gradient holds an inf or NaN" if skipped else
                   "every gradient entry is finite (look at each entry: a sum or norm of finite entries as large as "
                   "2e38 overflows, the entries do not)")
                + f"; got scaler.step returning {have['returned']!r}{history}")
            for index, (g, w) in enumerate(zip(have["unscaled"], want["unscaled"])):
                assert (g is None) == (w is None), f"{at}: parameter {index}'s .grad should be {w}, got {g}"
                if w is not None:
                    torch.testing.assert_close(g, w, rtol=1e-6, atol=0, equal_nan=True, msg=lambda m: (
                        f"{at}: parameter {index}'s gradient after step() should be the scaled one times the float32 "
                        f"reciprocal of the scale (inf once the scale is 0), as torch's GradScaler leaves it{history}"
                        f"\n{m}"))
            for index, (p, w) in enumerate(zip(have["params"], want["params"])):
                torch.testing.assert_close(p, w, rtol=1e-6, atol=0, equal_nan=True, msg=lambda m: (
                    f"{at}: parameter {index} after the step differs from torch's GradScaler's run{history}\n{m}"))
            assert have["scale"][0] == "float", f"{at}: get_scale() must return a Python float"
            assert have["scale"][1] == pytest.approx(want["scale"][1], rel=1e-6, abs=0), (
                f"{at}: the scale after update() should be {want['scale'][1]!r}, as torch's GradScaler has it, got "
                f"{have['scale'][1]!r} (a grown scale that would overflow float32 to inf is not taken: the old one "
                f"stays; backing off from the smallest float32 reaches 0){history}")
            assert have["tracker"] == want["tracker"], (
                f"{at}: state_dict()['_growth_tracker'] should be {want['tracker']!r}, got {have['tracker']!r} (it is "
                f"reset to 0 at each growth, even one that keeps the old scale because the new one is inf){history}")
        assert mine["fresh"][0] == reference["fresh"][0] == "AssertionError", (
            f"{where}: update() on a new scaler, with nothing recorded, must raise AssertionError as torch's "
            f"GradScaler does; " + ("it returned" if mine["fresh"][0] == "returned" else f"got {mine['fresh']}"))
        raised, message = mine["again"]
        assert raised == reference["again"][0] == "AssertionError" and "No inf checks" in message, (
            f"{where}: update() called again with no unscale_ or step since the last update() must raise "
            f"AssertionError(\"No inf checks were recorded prior to update.\"), as torch's GradScaler does; "
            + ("it returned" if raised == "returned" else f"got {raised} {message!r}"))
        assert (mine["scale_after"], mine["tracker_after"]) == (reference["scale_after"], reference["tracker_after"]), (
            f"{where}: an update() that raises must leave the scale and the tracker as they were "
            f"({reference['scale_after']!r}, {reference['tracker_after']!r}), got "
            f"({mine['scale_after']!r}, {mine['tracker_after']!r})")


BAD_SCALERS = [({"init_scale": 0.0}, "init_scale"), ({"init_scale": -1.0}, "init_scale"),
               ({"growth_factor": 1.0}, "growth_factor"), ({"growth_factor": 0.5}, "growth_factor"),
               ({"backoff_factor": 1.0}, "backoff_factor"), ({"backoff_factor": 0.0}, "backoff_factor"),
               ({"growth_interval": 0}, "growth_interval"), ({"growth_interval": 2.5}, "growth_interval"),
               # bools are ints to isinstance; edges float32 cannot hold as a positive finite scale
               ({"growth_interval": True}, "growth_interval"), ({"growth_interval": math.inf}, "growth_interval"),
               ({"growth_interval": math.nan}, "growth_interval"), ({"growth_interval": "2000"}, "growth_interval"),
               ({"init_scale": True}, "init_scale"), ({"init_scale": math.inf}, "init_scale"),
               ({"init_scale": math.nan}, "init_scale"), ({"init_scale": 1e39}, "init_scale"),
               ({"init_scale": 1e-50}, "init_scale"), ({"backoff_factor": math.nan}, "backoff_factor")]
# a count of steps may be an integral float (the course's rule for counts)
GOOD_SCALERS = [{"growth_interval": 3.0}, {"growth_interval": np.int64(5)}, {"init_scale": FLOAT32_MAX},
                {"init_scale": 2.0**-149}, {"init_scale": np.float32(1024.0)}]


def _bad_scaler_driver(module, cases, good):
    _refuse_subclass(module, _switch_off_torch_scaler())
    accepted = []
    for kwargs in good:
        try:
            state = module.DynamicLossScaler(**kwargs).state_dict()
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - the exception is the answer here
            accepted.append([type(exc).__name__, str(exc)])
            continue
        accepted.append({key: [_type_name(value), value] for key, value in state.items()
                         if key in ("scale", "growth_interval")})
    return [exception_raised_by(module.DynamicLossScaler, **kwargs) for kwargs, _ in cases], accepted


@pytest.mark.points(1)
def test_loss_scaler_rejects_bad_arguments():
    got, accepted = run("ex06", _bad_scaler_driver, BAD_SCALERS, GOOD_SCALERS, timeout=TIMEOUT)
    for kwargs, state in zip(GOOD_SCALERS, accepted):
        where = f"DynamicLossScaler({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
        assert isinstance(state, dict), (
            f"{where} is valid (a whole number of steps, a scale float32 holds); it raised {state}")
        if "growth_interval" in kwargs:
            assert state["growth_interval"] == ["int", int(kwargs["growth_interval"])], (
                f"{where}: state_dict()['growth_interval'] should be the int {int(kwargs['growth_interval'])} (a count "
                f"given as an integral float is used as int(...)), got {state['growth_interval']}")
        else:
            assert state["scale"] == ["float", float(kwargs["init_scale"])], (
                f"{where}: state_dict()['scale'] should be {float(kwargs['init_scale'])!r}, got {state['scale']}")
    for (kwargs, broken), (raised, message) in zip(BAD_SCALERS, got):
        where = f"DynamicLossScaler({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
        assert raised == "ValueError", f"{where} must raise ValueError, not {raised} {message}"
        assert broken in message, (
            f"{where}: the ValueError should name {broken} and say what to pass; it says {message!r}")


# ---------------------------------------------------------------- amp_train_step

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
HUGE = 3e38  # a target this far away makes the loss, and the scaled gradients, overflow: the step is skipped


def _amp_model(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)


def _amp_batches(case):
    """Each step's micro-batches: case["micro"] (inputs, targets) pairs of case["rows"] rows."""
    generator = torch.Generator().manual_seed(case["seed"])
    steps = []
    for step in range(case["steps"]):
        batches = []
        for index in range(case["micro"]):
            x, y = torch.randn(case["rows"], 8, generator=generator), torch.randn(case["rows"], 4, generator=generator)
            if [step, index] in case["bad"]:
                y = torch.full_like(y, HUGE)
            batches.append((x, y))
        steps.append(batches)
    return steps


def _amp_reference(case):
    """The recipe of torch's AMP documentation, with torch's GradScaler: parameters, losses and scales per step."""
    model, optimizer = _amp_model(case["seed"])
    scaler = torch.amp.GradScaler("cpu", init_scale=case["init_scale"])
    out = []
    for batches in _amp_batches(case):
        total = 0.0
        for inputs, targets in batches:
            with torch.autocast("cpu", dtype=DTYPES[case["dtype"]]):
                loss = F.mse_loss(model(inputs), targets)
            scaler.scale(loss / len(batches)).backward()
            total += loss.item()
        if case["max_norm"] is not None:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), case["max_norm"])
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        out.append({"loss": total / len(batches), "scale": scaler.get_scale(),
                    "params": [p.detach().clone() for p in model.parameters()]})
    return out


def _spy_scaler(log, init_scale):
    """A torch GradScaler that logs every call made to it (unscale_ by the user, not the one step() makes)."""

    class SpyScaler(torch.amp.GradScaler):
        inside_step = False

        def scale(self, outputs):
            log.append(["scale"])
            return super().scale(outputs)

        def unscale_(self, optimizer):
            if not self.inside_step:
                log.append(["unscale_"])
            return super().unscale_(optimizer)

        def step(self, optimizer, *args, **kwargs):
            norms = [p.grad.detach().float().norm() for group in optimizer.param_groups for p in group["params"]
                     if p.grad is not None]
            log.append(["step", float(torch.stack(norms).norm()) if norms else None])
            self.inside_step = True
            try:
                return super().step(optimizer, *args, **kwargs)
            finally:
                self.inside_step = False

        def update(self, new_scale=None):
            log.append(["update"])
            return super().update(new_scale)

    return SpyScaler("cpu", init_scale=init_scale)


def _watch(model, log):
    """Forward hooks on the Linear layers: autocast on? output dtype? and, in backward, autocast off?"""
    def forward_hook(layer, inputs, output):
        log.append(["forward", torch.is_autocast_enabled("cpu"), str(output.dtype)])
        if output.requires_grad:
            output.register_hook(lambda grad: log.append(["backward", torch.is_autocast_enabled("cpu")]))

    for layer in model:
        if isinstance(layer, nn.Linear):
            layer.register_forward_hook(forward_hook)


def _log_clipping(module, log):
    """torch.nn.utils.clip_grad_norm_ logs its calls, by whichever name the learner's file reaches it."""
    import torch.nn.utils.clip_grad as clip_grad

    original = torch.nn.utils.clip_grad_norm_

    def clip_grad_norm_(*args, **kwargs):
        log.append(["clip"])
        return original(*args, **kwargs)

    torch.nn.utils.clip_grad_norm_ = clip_grad.clip_grad_norm_ = clip_grad_norm_
    if getattr(module, "clip_grad_norm_", None) is original:
        module.clip_grad_norm_ = clip_grad_norm_


def _amp_driver(module, cases):
    out, log = [], []
    _log_clipping(module, log)
    for case in cases:
        model, optimizer = _amp_model(case["seed"])
        _watch(model, log)
        scaler = _spy_scaler(log, case["init_scale"])

        def loss_fn(outputs, targets):
            log.append(["loss", torch.is_autocast_enabled("cpu")])
            return F.mse_loss(outputs, targets)

        steps = []
        for batches in _amp_batches(case):
            copies = [(x.clone(), y.clone()) for x, y in batches]
            del log[:]
            returned = module.amp_train_step(model, optimizer, scaler, batches, loss_fn, device_type="cpu",
                                             dtype=DTYPES[case["dtype"]], max_norm=case["max_norm"])
            steps.append({"returned": [_type_name(returned), float(returned) if isinstance(returned, (int, float))
                                       else None],
                          "params": [p.detach().clone() for p in model.parameters()], "scale": scaler.get_scale(),
                          "grads_none": [p.grad is None for p in model.parameters()], "log": list(log),
                          "unchanged": all(torch.equal(x, cx) and torch.equal(y, cy)
                                           for (x, y), (cx, cy) in zip(batches, copies))})
        out.append(steps)
    return out


def _describe_amp_case(case):
    return (f"amp_train_step with {case['micro']} micro-batch{'es' if case['micro'] > 1 else ''} of {case['rows']} "
            f"rows, dtype=torch.{case['dtype']}, max_norm={case['max_norm']!r}")


def _bad_steps(case, step):
    return [index for s, index in case["bad"] if s == step]


def _same_float(got, want) -> bool:
    return (math.isnan(got) and math.isnan(want)) or got == want or math.isclose(got, want, rel_tol=1e-6)


@st.composite
def amp_cases(draw):
    steps, micro = draw(st.integers(2, 4)), draw(st.integers(1, 4))
    bad = draw(st.lists(st.tuples(st.integers(0, steps - 1), st.integers(0, micro - 1)).map(list), max_size=2))
    return {"seed": draw(st.integers(0, 10**4)), "steps": steps, "micro": micro, "rows": draw(st.integers(1, 4)),
            "dtype": draw(st.sampled_from(sorted(DTYPES))), "bad": bad,
            "max_norm": draw(st.sampled_from([None, None, 0.0, 0.01, 0.1, 1.0])),
            "init_scale": draw(st.sampled_from([2.0**16, 256.0]))}


def amp_case(steps, micro, dtype="bfloat16", max_norm=None, bad=(), rows=3, seed=0, init_scale=2.0**16):
    return {"seed": seed, "steps": steps, "micro": micro, "rows": rows, "dtype": dtype, "bad": [list(b) for b in bad],
            "max_norm": max_norm, "init_scale": init_scale}


# Always run: three micro-batches with clipping that clips, in bfloat16 and in float16 (whose backward
# overflows at the default scale at first), an overflowing micro-batch (a skipped step), one micro-batch.
AMP_CASES = [amp_case(3, 3, "bfloat16", max_norm=0.01, bad=[(1, 2)]),
             amp_case(3, 3, "float16", max_norm=0.05, seed=1),
             amp_case(3, 2, "float16", bad=[(0, 0)], seed=2, init_scale=256.0),
             amp_case(2, 1, "bfloat16", max_norm=0.0, seed=3)]  # 0.0 clips every gradient to 0: not "no clipping"


@pytest.mark.points(3)
@settings(max_examples=4)
@given(cases=st.lists(amp_cases(), min_size=1, max_size=3))
@example(cases=AMP_CASES)
def test_amp_train_step_matches_torchs_amp_recipe(cases):
    got = run("ex06", _amp_driver, cases, timeout=TIMEOUT)
    for case, steps in zip(cases, got):
        reference = _amp_reference(case)
        for step, (mine, want) in enumerate(zip(steps, reference)):
            bad = _bad_steps(case, step)
            where = (f"{_describe_amp_case(case)}, step {step}"
                     + (f" (micro-batch {bad[0]} overflows: the step must be skipped)" if bad else ""))
            kind, value = mine["returned"]
            assert kind == "float", f"{where}: return the mean loss as a Python float (loss.item()), got a {kind}"
            assert _same_float(value, want["loss"]), (
                f"{where}: should return {want['loss']!r}, the mean of the micro-batches' losses (not divided by their "
                f"number, not scaled), got {value!r}")
            for index, (param, ref) in enumerate(zip(mine["params"], want["params"])):
                torch.testing.assert_close(param, ref, rtol=1e-5, atol=1e-6, msg=lambda m: (
                    f"{where}: parameter {index} differs from torch's AMP recipe (forward and loss under autocast, "
                    f"scaler.scale(loss / len(micro_batches)).backward() outside it, unscale_ then clip_grad_norm_ "
                    f"when max_norm is given, scaler.step, scaler.update once)\n{m}"))
            assert mine["scale"] == want["scale"], (
                f"{where}: the scaler's scale should be {want['scale']!r} after the step, got {mine['scale']!r} "
                "(call scaler.update() once per optimizer step)")
            assert mine["unchanged"], f"{where}: the micro-batches must be left as they were"


def _events(log, *names):
    return [event[0] for event in log if event[0] in names]


STRUCTURE_CASES = [amp_case(2, 3, "bfloat16", max_norm=0.05, seed=4), amp_case(2, 2, "float16", seed=5),
                   amp_case(2, 4, "bfloat16", max_norm=1.0, bad=[(0, 1)], seed=6),
                   amp_case(1, 2, "bfloat16", max_norm=0.0, seed=7)]


@pytest.mark.points(2)
def test_amp_train_step_calls_the_scaler_in_order():
    got = run("ex06", _amp_driver, STRUCTURE_CASES, timeout=TIMEOUT)
    for case, steps in zip(STRUCTURE_CASES, got):
        for step, result in enumerate(steps):
            where = f"{_describe_amp_case(case)}, step {step}"
            calls = _events(result["log"], "scale", "unscale_", "clip", "step", "update")
            want = ["scale"] * case["micro"] + (["unscale_", "clip"] if case["max_norm"] is not None else []) + [
                "step", "update"]
            if case["max_norm"] is None and calls == ["scale"] * case["micro"] + ["unscale_", "step", "update"]:
                calls = want  # unscaling by hand without clipping is harmless: step() would unscale anyway
            assert calls == want, (
                f"{where}: the calls to the scaler and to torch.nn.utils.clip_grad_norm_ should be {want}: scale each "
                f"micro-batch's loss, then {'unscale_ BEFORE clipping, ' if case['max_norm'] is not None else ''}"
                f"step and update once per optimizer step; got {calls}")
            assert all(result["grads_none"]), (
                f"{where}: every parameter's .grad should be None when amp_train_step returns "
                f"(optimizer.zero_grad(set_to_none=True) after the step), got None for {result['grads_none']}")
            norm = next(event[1] for event in result["log"] if event[0] == "step")
            if case["max_norm"] is not None and not _bad_steps(case, step):
                assert norm is not None and norm <= case["max_norm"] * (1 + 1e-3), (
                    f"{where}: when scaler.step is called, the gradients' norm should be at most max_norm "
                    f"{case['max_norm']} (clipped after unscale_), got {norm}")


@pytest.mark.points(2)
def test_amp_train_step_autocasts_forward_not_backward():
    got = run("ex06", _amp_driver, STRUCTURE_CASES, timeout=TIMEOUT)
    for case, steps in zip(STRUCTURE_CASES, got):
        for step, result in enumerate(steps):
            where = f"{_describe_amp_case(case)}, step {step}"
            forwards = [event for event in result["log"] if event[0] == "forward"]
            assert forwards and all(on and dtype == f"torch.{case['dtype']}" for _, on, dtype in forwards), (
                f"{where}: the model's forward must run under torch.autocast('cpu', dtype=torch.{case['dtype']}), "
                f"its Linear layers giving torch.{case['dtype']} outputs; the layers saw (autocast on, output dtype) "
                f"{[(on, dtype) for _, on, dtype in forwards]}")
            losses = [event[1] for event in result["log"] if event[0] == "loss"]
            assert len(losses) == case["micro"] and all(losses), (
                f"{where}: call loss_fn once per micro-batch, inside the autocast block with the forward (autocast "
                f"decides which dtype the loss runs in); loss_fn saw autocast on: {losses}")
            backwards = [event[1] for event in result["log"] if event[0] == "backward"]
            assert backwards and not any(backwards), (
                f"{where}: run backward OUTSIDE the autocast block (leave the with block first); during backward "
                f"autocast was on: {backwards}")


def _empty_driver(module):
    model, optimizer = _amp_model(0)
    return exception_raised_by(module.amp_train_step, model, optimizer, torch.amp.GradScaler("cpu"), [], F.mse_loss)


@pytest.mark.points(1)
def test_amp_train_step_rejects_no_micro_batches():
    raised, message = run("ex06", _empty_driver, timeout=TIMEOUT)
    assert raised == "ValueError", (
        f"amp_train_step(..., micro_batches=[]) must raise ValueError (nothing to step on), not {raised} {message}")
