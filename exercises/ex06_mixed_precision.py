# Exercise file: replace each `raise NotImplementedError(...)` with your code,
# then run `check("ex06")` in the notebook (or `python3 course.py check ex06`).
"""Exercise 06: Mixed precision. Floating-point formats, rounding to bfloat16, dynamic loss scaling, an AMP step.

Notebook: notebooks/06_mixed_precision.ipynb

Four pieces, from the bits up: the limits of any binary floating-point format from its two field widths; a
float32 tensor rounded to bfloat16 by hand, bit for bit what torch does; a dynamic loss scaler that behaves
like torch.amp.GradScaler step for step; and one optimizer step of automatic mixed precision over several
micro-batches, with autocast, loss scaling, accumulation and clipping in the right order.
Everything runs on the CPU (autocast with device_type "cpu" and bfloat16 or float16). The tests compare with
torch's own code in the test process: torch.finfo, Tensor.to(torch.bfloat16), torch.amp.GradScaler("cpu")
and the training recipe of torch's AMP documentation. While your code runs, torch.finfo, torch's conversions
to bfloat16 and its GradScaler are switched off, so each piece has to be built, not borrowed; and the tests
watch how amp_train_step works, not only what it returns: every call it makes to the scaler, in order, whether
autocast is on during forward, the loss and backward, and what is left in the gradients afterwards.
"""

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn


class FormatLimits(NamedTuple):
    """What a floating-point format can hold (all Python floats): see format_limits."""

    max: float  # the largest finite value
    smallest_normal: float  # the smallest positive normal value (torch.finfo's tiny)
    smallest_subnormal: float  # the smallest positive value: a subnormal, only the last mantissa bit set
    eps: float  # the gap between 1.0 and the next larger value


def format_limits(exponent_bits: int, mantissa_bits: int, *, has_inf: bool = True) -> FormatLimits:
    """The limits of a binary floating-point format with these field widths (1 sign bit, exponent, mantissa).

    A value's bits are sign | exponent field E (exponent_bits wide) | mantissa field M (mantissa_bits = m
    wide), with bias = 2**(exponent_bits - 1) - 1:
    - E = 0: subnormal, (M / 2**m) * 2**(1 - bias) (zero when M = 0);
    - 0 < E < all ones: normal, (1 + M / 2**m) * 2**(E - bias);
    - E = all ones: with has_inf=True (IEEE 754: float16, bfloat16, float32, float64, float8_e5m2), inf when
      M = 0 and NaN otherwise, so the largest finite value is (2 - 2**-m) * 2**bias; with has_inf=False (the
      "fn" layout of float8_e4m3fn: finite, no inf) this binade holds normal values like the others, only
      E and M all ones together is NaN, so the largest finite value has E all ones and M = all ones - 1:
      (2 - 2**(1 - m)) * 2**(bias + 1), 448 for 4 exponent and 3 mantissa bits.
    Return FormatLimits(max, smallest_normal, smallest_subnormal, eps) of Python floats, exact (math.ldexp(x, n)
    is x * 2**n without rounding): smallest_normal = 2**(1 - bias), smallest_subnormal = 2**(1 - bias - m),
    eps = 2**-m. For float32, format_limits(8, 23) gives torch.finfo(torch.float32)'s max, tiny and eps; but
    compute them, do not look them up: torch.finfo and the lesson's course_lib.precision are switched off here.
    A bit width is a count: an int (numpy's integers too) or an integral float such as 8.0 (the course's rule for
    counts; it is used as int(8.0) = 8, and the limits are the same as for 8). Raise ValueError, naming the
    argument and saying what to pass, unless exponent_bits is such a whole number from 2 to 11 and mantissa_bits
    one from 1 to 52 (True and False are not numbers of bits, though bool is an int to isinstance; 2.5, nan, inf
    and "8" are refused too), and has_inf is a bool.
    Every limit must fit a Python float (a float64). All do but one: with 11 exponent bits and has_inf=False the
    largest value is (2 - 2**(1 - m)) * 2**1024, at least 2**1024, beyond float64's max (about 1.8e308), so raise
    ValueError for that combination too, naming has_inf and saying what to pass (has_inf=True, or 10 exponent
    bits or fewer) instead of letting math.ldexp raise OverflowError.
    """
    raise NotImplementedError('check the arguments first; then bias = 2**(e-1) - 1 and each limit as math.ldexp(mantissa, exponent); only max depends on has_inf')


def round_to_bfloat16(x: torch.Tensor) -> torch.Tensor:
    """`x` (float32) rounded to bfloat16 by bit manipulation: bit for bit what x.to(torch.bfloat16) gives.

    bfloat16 is the top 16 bits of a float32 (sign, the same 8 exponent bits, 7 of the 23 mantissa bits), so
    rounding is integer arithmetic on the bits, `x.view(torch.int32)`, dropping the low 16 bits:
    - round to nearest, ties to even: add 0x7FFF plus the lowest kept bit ((bits >> 16) & 1), then keep the top
      16 bits: a low half above 0x8000 rounds up, below rounds down, exactly 0x8000 rounds to the even neighbour;
      a carry out of the mantissa moves into the exponent, which is right (1.99... rounds to 2.0, and the
      largest float32s round to inf, 0x7F80);
    - inf and -inf stay as they are (their low bits are 0); NaN must stay NaN (adding to a NaN with only low
      mantissa bits, 0x7F800001, would carry it to inf): return a quiet NaN, 0x7FC0, for every NaN (torch
      gives 0x7FC0 or 0xFFFF depending on its code path; the tests accept any NaN);
    - ±0 and subnormals need nothing special.
    Mind the sign bit: an int32 view of a negative number is negative, and >> on it shifts ones in; work in
    int64 (`bits & 0xFFFFFFFF` is the unsigned value) or mask after shifting. The 16-bit result goes back to
    a tensor with `.to(torch.int16)` (values from 0x8000 up are the negative int16s: subtract 0x10000 first)
    and `.view(torch.bfloat16)`.
    Return a new bfloat16 tensor of x's shape (0-d and empty included; x may be non-contiguous, a transposed or
    strided view), x left unchanged. Do not convert with torch (.to, .bfloat16(), .type, copy_ into a bfloat16
    tensor, torch.tensor(..., dtype=torch.bfloat16)): the tests switch those off while your code runs;
    .view(torch.bfloat16), which only reinterprets bits, stays allowed.
    Raise TypeError, saying what to pass, if x is not a torch.Tensor or not float32.
    """
    raise NotImplementedError('work on the float32 bits as int64 (so that adding cannot overflow); round half to even by adding 0x7FFF plus the lowest bit you keep; NaNs apart; view the top 16 bits as bfloat16')


def _float32(value: float) -> float:
    """`value` rounded to float32 (inf when too large), as a Python float: GradScaler keeps its scale in float32."""
    return torch.tensor(value, dtype=torch.float32).item()


class DynamicLossScaler:
    """Dynamic loss scaling: what torch.amp.GradScaler("cpu") does, step for step, in plain Python.

    A float16 gradient underflows to 0 below about 6e-8; multiplying the loss by a large scale S before
    backward multiplies every gradient by S, lifting small ones into range, and dividing the gradients by S
    before the optimizer step undoes it. Too large an S overflows: some gradient is inf or NaN. Then the step
    is skipped and S shrinks; after `growth_interval` steps in a row without inf/NaN, S grows again.

        scaler = DynamicLossScaler()
        for inputs, targets in batches:
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), targets)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)            # optional: only to look at or clip the real gradients
            scaler.step(optimizer)                # skipped when a gradient is inf or NaN
            scaler.update()

    State: the scale (starting at init_scale) and a growth tracker (0 at the start), plus, per optimizer since
    the last update(), whether it was unscaled, whether it stepped, and whether inf/NaN was found (key the
    optimizers by id(optimizer): an optimizer need not be hashable).
    - scale(loss): return loss times the scale held as torch does, a 0-d float32 tensor on loss's device
      (torch.tensor(scale, dtype=torch.float32, device=loss.device)), a new tensor (backward through it works);
      loss is unchanged. Type promotion then gives torch's dtype: a float16 or bfloat16 loss of one or more
      dimensions stays in its dtype, a 0-d one becomes float32 (a 0-d float16 loss of 2.0 times 65536 is
      131072.0, not an inf), a float64 loss stays float64.
    - unscale_(optimizer): divide, in place, every gradient (not None) of the parameters in
      optimizer.param_groups by the scale, and record whether any gradient holds an inf, -inf or NaN (checked
      element by element before dividing: finite gradients as large as 2e38 are fine even where their sum
      would overflow). A scale that has backed off all the way to 0 has the reciprocal inf, as in torch. A
      second call for the same optimizer before update() raises RuntimeError("unscale_() has already been
      called on this optimizer since the last update()."), one after step() raises
      RuntimeError("unscale_() is being called after step().").
    - step(optimizer, *args, **kwargs): unscale_ first unless it was already called for this optimizer; if
      inf/NaN was found, skip optimizer.step and return None; otherwise return
      optimizer.step(*args, **kwargs). A second step() for the same optimizer before update() raises
      RuntimeError("step() has already been called since the last update().").
    - update(): once per iteration, after every optimizer's step. If inf/NaN was found by ANY optimizer's
      unscale since the last update, multiply the scale by backoff_factor ONCE and set the tracker to 0;
      otherwise add 1 to the tracker and, when it reaches growth_interval, multiply the scale by growth_factor
      and set the tracker to 0, except that a scale which would overflow float32 to inf is kept as it was
      (torch's _amp_update_scale_ does that: 2.0**127 times 2 stays 2.0**127). Then forget every optimizer's
      record. If no optimizer was unscaled or stepped since the last update() (or since the start), raise
      AssertionError("No inf checks were recorded prior to update.") as torch's GradScaler does (an
      AssertionError, not a RuntimeError), leaving the scale and the tracker as they were.
    - get_scale(): the scale as a Python float.
    - state_dict(): {"scale": float, "growth_factor": float, "backoff_factor": float, "growth_interval": int,
      "_growth_tracker": int}, torch's GradScaler.state_dict() keys; load_state_dict(state) takes such a dict,
      from this class or from torch's GradScaler, and keeps no reference to it. An empty dict (what a disabled
      GradScaler saves) raises RuntimeError("The source state dict is empty, possibly because it was saved from
      a disabled instance of GradScaler.") as torch does, and changes nothing.
    torch keeps the scale as a float32 number and unscales by multiplying by its reciprocal rounded to float32;
    do the same (round the scale with `_float32` above after each change) to match it bit for bit; the tests
    allow a relative difference of 1e-6.
    Raise ValueError, saying what to pass, unless init_scale is a number > 0 that float32 holds as a positive
    finite value (not inf or nan, not above float32's max of about 3.4e38, which would round to inf, nor so
    small that it rounds to 0), growth_factor > 1, 0 < backoff_factor < 1, and growth_interval is a count of
    steps, 1 or more: an int or an integral float such as 2000.0 (the course's rule for counts; kept as
    int(2000.0)), not True, 2.5, nan or inf. Numbers are ints or floats (numpy's too), never bools.
    Do not use torch's GradScaler (nor its torch._amp_update_scale_ and
    torch._amp_foreach_non_finite_check_and_unscale_): the tests switch them off.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        raise NotImplementedError('check the arguments; keep the scale (as a float32 value), the factors, the interval, a growth tracker at 0, and an empty dict of per-optimizer records keyed by id(optimizer)')

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("a new tensor: loss times the scale as a 0-d float32 tensor on loss's device")

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        raise NotImplementedError('refuse a second unscale_ (or one after step) for this optimizer; under torch.no_grad(), for every param.grad that is not None note whether it is all finite, then multiply it in place by the float32 reciprocal of the scale; record found_inf')

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError('refuse a second step; unscale_ unless already done for this optimizer; skip (return None) when inf/NaN was found, else return optimizer.step(*args, **kwargs); mark it stepped')

    def update(self) -> None:
        raise NotImplementedError("found = any optimizer's found_inf; back off once and reset the tracker, or count a good step and grow every growth_interval of them; then clear the per-optimizer records")

    def get_scale(self) -> float:
        raise NotImplementedError('the scale as a Python float')

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError("a new dict with torch's five keys")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError('copy the five values out of the dict (as float, float, float, int, int)')


def amp_train_step(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any,
                   micro_batches: Sequence[tuple[Any, Any]], loss_fn: Callable[[Any, Any], torch.Tensor], *,
                   device_type: str = "cpu", dtype: torch.dtype = torch.bfloat16,
                   max_norm: float | None = None) -> float:
    """One optimizer step of automatic mixed precision over `micro_batches`, the recipe of torch's AMP docs.

    `scaler` is a torch.amp.GradScaler or your DynamicLossScaler (use only scale, unscale_, step and update).
    `micro_batches` is a list of (inputs, targets) pairs, whose gradients add up to one step:
    1. for each micro-batch: run the forward AND the loss, `loss_fn(model(inputs), targets)`, inside
       `with torch.autocast(device_type, dtype=dtype):` (matmuls in low precision, the loss in float32 as
       autocast decides); leave the block, divide the loss by len(micro_batches) (the gradient of the mean over
       the micro-batches) and run `scaler.scale(loss).backward()` OUTSIDE autocast (backward runs each op in
       the dtype its forward used anyway);
    2. if max_norm is not None: `scaler.unscale_(optimizer)` first, then
       `torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`: clipping the still-scaled gradients
       would clip S times too hard;
    3. `scaler.step(optimizer)` (it skips the step if a gradient is inf or NaN), then `scaler.update()`, once
       per optimizer step, never per micro-batch;
    4. `optimizer.zero_grad(set_to_none=True)`: the gradients are None when you return.
    Return the mean of the micro-batches' losses, undivided and unscaled, as a Python float (inf or NaN if a
    loss was). The micro-batches are left unchanged. Raise ValueError if micro_batches is empty.
    """
    raise NotImplementedError('loop: autocast around model and loss_fn; backward of scaler.scale(loss / n) outside it; keep loss.item(); then unscale_ + clip_grad_norm_ only if max_norm is given; step, update, zero_grad(set_to_none=True); return the mean')
