"""Binary floating-point formats and rounding to them: what each format holds, from its bits (notebook 06).

    Format, FORMATS                    fp32, tf32, fp16, bf16, fp8 e4m3, fp8 e5m2: bits, torch dtype, what each is for
    limits_table(), print_limits()     max, smallest normal, smallest subnormal, eps: from the bits and from torch
    round_to(x, fmt)                   a number or tensor rounded to a format (torch's casts; tf32 on the fp32 bits)
    bit_fields(value, fmt)             sign, exponent and mantissa bits of the rounded value
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.precision._checks import _real
from course_lib.tables import print_table

__all__ = ["Format", "FORMATS", "limits_table", "print_limits", "round_to", "bit_fields"]

# ---------------------------------------------------------------------------------------------------- formats


@dataclass(frozen=True)
class Format:
    """A binary floating-point format: 1 sign bit, exponent bits, mantissa bits, and its torch dtype (notebook 06).

    dtype is None for tf32, which is not a storage type: tensor cores read fp32 inputs with their mantissa cut to 10
    bits. has_inf: False for fp8 e4m3 (torch.float8_e4m3fn, "fn": finite and NaN only), whose top exponent holds
    ordinary numbers up to 448 and only S.1111.111 is NaN. The properties compute the limits from the bits.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    dtype: torch.dtype | None
    has_inf: bool
    use: str

    @property
    def bits(self) -> int:
        """1 + exponent_bits + mantissa_bits (19 for tf32, which is stored in 32)."""
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        """The exponent bias, 2^(e−1) − 1: a stored exponent field E means 2^(E − bias)."""
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def max(self) -> float:
        """The largest finite value, from the bits.

        With inf (IEEE style) the top exponent field is reserved, so the largest is (2 − 2^−m) · 2^(2^e − 2 − bias).
        Without inf (e4m3fn) the top field holds numbers too, except the all-ones mantissa (NaN):
        (2 − 2^(1−m)) · 2^(2^e − 1 − bias) = 1.75 · 2^8 = 448.
        """
        m, top = self.mantissa_bits, 2**self.exponent_bits - 1
        if self.has_inf:
            return (2.0 - 2.0**-m) * 2.0 ** (top - 1 - self.bias)
        return (2.0 - 2.0 ** (1 - m)) * 2.0 ** (top - self.bias)

    @property
    def smallest_normal(self) -> float:
        """2^(1 − bias): exponent field 1, mantissa 0."""
        return 2.0 ** (1 - self.bias)

    @property
    def smallest_subnormal(self) -> float:
        """2^(1 − bias − m): exponent field 0, mantissa ...001 (the bit pattern 1)."""
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """2^−m: the gap between 1 and the next number (torch.finfo's eps)."""
        return 2.0**-self.mantissa_bits

    @property
    def storage_bytes(self) -> int:
        """Bytes per element in memory: the dtype's itemsize, 4 for tf32 (held as fp32)."""
        return self.dtype.itemsize if self.dtype is not None else 4


FORMATS: dict[str, Format] = {f.name: f for f in [
    Format("fp32", 8, 23, torch.float32, True, "master weights, optimizer state, reductions"),
    Format("tf32", 8, 10, None, True, "tensor-core input for fp32 matmuls (Ampere and later), stored as fp32"),
    Format("fp16", 5, 10, torch.float16, True, "activations and matmuls; needs loss scaling"),
    Format("bf16", 8, 7, torch.bfloat16, True, "activations and matmuls; fp32's range, no loss scaling"),
    Format("fp8 e4m3", 4, 3, torch.float8_e4m3fn, False, "matmul inputs in the forward, with a scale per tensor"),
    Format("fp8 e5m2", 5, 2, torch.float8_e5m2, True, "gradients in the backward: range before precision"),
]}


def _format(fmt) -> Format:
    """The Format named fmt (a key of FORMATS), or fmt itself if it is a Format."""
    if isinstance(fmt, Format):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a format name, one of {', '.join(map(repr, FORMATS))}, "
                        f"not {type(fmt).__name__}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(map(repr, FORMATS))}")
    return FORMATS[fmt]


def _dtype(dtype, what: str = "dtype") -> torch.dtype:
    """A floating torch dtype, from a dtype or a format name that has one."""
    if isinstance(dtype, str):
        f = _format(dtype)
        if f.dtype is None:
            raise ValueError(f"{f.name} has no torch dtype (it is a matmul input format held as fp32): "
                             "pass a format that has one")
        return f.dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{what} must be a floating-point torch dtype such as torch.float16, or a format name, "
                        f"not {dtype!r}")
    return dtype


def _torch_limits(f: Format) -> tuple[dict[str, float], str]:
    """max, smallest normal, smallest subnormal and eps as torch gives them, and where they come from."""
    if f.dtype is not None:
        info = torch.finfo(f.dtype)
        one = torch.tensor([1], dtype=_INT_VIEW[f.bits]).view(f.dtype)  # bit pattern 0...01: the smallest subnormal
        return ({"max": float(info.max), "smallest normal": float(info.smallest_normal),
                 "smallest subnormal": one.to(torch.float64).item(), "eps": float(info.eps)},
                f"torch.finfo({f.dtype}); subnormal: bit pattern 1 viewed as {f.dtype}")
    # tf32 has no dtype: read its limits off fp32 bit patterns whose 13 low mantissa bits are 0.
    low = 23 - f.mantissa_bits
    patterns = {"max": (0x7F7FFFFF >> low) << low, "smallest normal": 0x00800000, "smallest subnormal": 1 << low,
                "one plus eps": 0x3F800000 | (1 << low)}
    values = dict(zip(patterns, torch.tensor(list(patterns.values()), dtype=torch.int32).view(torch.float32)
                      .to(torch.float64).tolist()))
    values["eps"] = values.pop("one plus eps") - 1.0
    return values, "float32 bit patterns with the 13 low mantissa bits 0"


_INT_VIEW = {8: torch.uint8, 16: torch.int16, 32: torch.int32}
_LIMITS = ("max", "smallest normal", "smallest subnormal", "eps")


def limits_table() -> list[dict]:
    """One row per format: each limit from the bits and from torch, and whether they agree (notebook 06).

    Keys: format, exponent bits, mantissa bits, dtype; max, smallest normal, smallest subnormal, eps (from the bits,
    Format's formulas); torch max, torch smallest normal, torch smallest subnormal, torch eps (torch.finfo, the
    subnormal from the bit pattern 1 viewed as the dtype; for tf32 fp32 bit patterns); torch source; agree (True
    when all four pairs are equal, exactly: every one is a power of two or a short binary fraction).
    """
    rows = []
    for f in FORMATS.values():
        from_torch, source = _torch_limits(f)
        row = {"format": f.name, "exponent bits": f.exponent_bits, "mantissa bits": f.mantissa_bits,
               "dtype": str(f.dtype) if f.dtype is not None else "none (stored as torch.float32)",
               "max": f.max, "smallest normal": f.smallest_normal, "smallest subnormal": f.smallest_subnormal,
               "eps": f.eps}
        row |= {f"torch {k}": from_torch[k] for k in _LIMITS}
        row["torch source"] = source
        row["agree"] = all(row[k] == row[f"torch {k}"] for k in _LIMITS)
        rows.append(row)
    return rows


def print_limits() -> None:
    """Print limits_table() as a table: the limits from the bits, and whether torch agrees (notebook 06)."""
    rows = [[r["format"], f"1+{r['exponent bits']}+{r['mantissa bits']}", f"{r['max']:.4g}",
             f"{r['smallest normal']:.3g}", f"{r['smallest subnormal']:.3g}", f"{r['eps']:.3g}",
             "yes" if r["agree"] else "NO"] for r in limits_table()]
    print_table(["format", "bits s+e+m", "max", "smallest normal", "smallest subnormal", "eps", "torch agrees"], rows)
    print("torch's side: torch.finfo and the bit pattern 1 viewed as the dtype; tf32 (no dtype): fp32 bit patterns.")


# ---------------------------------------------------------------------------------------------------- rounding


def _round_tensor(t: torch.Tensor, f: Format) -> torch.Tensor:
    """t (float64) rounded to f, as float64."""
    if f.dtype is not None:
        return t.to(f.dtype).to(torch.float64)
    # tf32: round the fp32 value's mantissa to 10 bits, to nearest, ties to even, on its bits (int64: no overflow).
    low = 23 - f.mantissa_bits
    bits = t.to(torch.float32).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    finite = (bits & 0x7F800000) != 0x7F800000
    half_minus_one = (1 << (low - 1)) - 1
    rounded = (bits + half_minus_one + ((bits >> low) & 1)) & ~((1 << low) - 1)  # may carry up to inf: correct
    rounded = torch.where(finite, rounded, bits)
    rounded = torch.where(rounded >= 2**31, rounded - 2**32, rounded)  # back to int32's signed range
    return rounded.to(torch.int32).view(torch.float32).to(torch.float64)


def round_to(x, fmt: str):
    """x rounded to the format: a float for a number, a float64 tensor for a tensor (notebook 06).

    Through torch's casts (x → float64 → the dtype → float64), so the result is what torch stores: round to nearest,
    ties to even; overflow gives inf, except fp8 e4m3, which has no inf (torch 2.14 saturates at ±448, see
    bits_html). torch casts a float64 to a narrower dtype through float32, so a float64 that lies within float32's
    rounding of a halfway point rounds twice (1 + 2^-11 + 2^-40 gives 1.0 in fp16, not 1 + 2^-10); a number you
    type with a few digits never does. tf32 has no dtype: the fp32 value's mantissa is rounded to 10 bits, to nearest,
    ties to even, on its int32 bits (GPU libraries round fp32 to tf32 to nearest or cut the bits; the two differ by
    at most one ulp).
    """
    f = _format(fmt)
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool or x.is_complex():
            raise TypeError(f"x must be a real-valued tensor, not one of {x.dtype}")
        return _round_tensor(x.detach().to(torch.float64), f)
    if not _real(x):
        raise TypeError(f"x must be a real number or a tensor, not {type(x).__name__}")
    return _round_tensor(torch.tensor(float(x), dtype=torch.float64), f).item()


def _pattern(value: float, f: Format) -> int:
    """The bit pattern (as an unsigned int of f.bits bits) of value rounded to f."""
    t = torch.tensor(float(value), dtype=torch.float64)
    if f.dtype is not None:
        return t.to(f.dtype).view(_INT_VIEW[f.bits]).item() & (2**f.bits - 1)
    fp32_bits = _round_tensor(t, f).to(torch.float32).view(torch.int32).item() & 0xFFFFFFFF
    return fp32_bits >> (23 - f.mantissa_bits)


def bit_fields(value: float, fmt: str) -> tuple[str, str, str]:
    """The sign, exponent and mantissa bits of value rounded to the format, as strings of 0 and 1 (notebook 06).

    bit_fields(1.0, "bf16") is ("0", "01111111", "0000000"). tf32 gives its 19 bits (the top 19 of the fp32 word).
    """
    f = _format(fmt)
    if not _real(value):
        raise TypeError(f"value must be a real number, not {type(value).__name__}")
    word = format(_pattern(value, f), f"0{f.bits}b")
    return word[0], word[1:1 + f.exponent_bits], word[1 + f.exponent_bits:]
