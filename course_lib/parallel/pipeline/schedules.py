"""Pipeline schedules played out op by op, and what they cost, by simulation and by formula (notebook 07).

    Op, simulate(kind, stages, m, ...)   a schedule played out op by op: GPipe, 1F1B, interleaved 1F1B, zero bubble
    bubble, makespan, peak_in_flight     what a schedule costs: idle device time, length, activations held
    gpipe_bubble, interleaved_bubble     the published formulas (GPipe; Narayanan et al. 2021)
    as_fraction_of_total, as_ratio_to_ideal   between "bubble / total time" and "bubble / ideal time"

The simulation is a model: fixed op durations, no launch costs, a transfer costs comm_time and nothing else.
benchmarks/pipeline_step.py measures torch.distributed.pipelining on gloo ranks against it. The pictures of a
schedule are in pictures.py, real models cut into stages in stages.py.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

from course_lib.parallel import whole_number

__all__ = ["Op", "KINDS", "simulate", "bubble", "makespan", "peak_in_flight", "gpipe_bubble", "interleaved_bubble",
           "as_fraction_of_total", "as_ratio_to_ideal"]

# The schedules simulate() knows, with where each comes from.
KINDS: dict[str, str] = {
    "gpipe": "GPipe (Huang et al. 2019, arXiv:1811.06965): every micro-batch's forward, then every backward "
             "(all-forward-all-backward); torch's ScheduleGPipe",
    "1f1b": "1F1B (PipeDream-Flush; Narayanan et al. 2021, arXiv:2104.04473 §2.2.1): min(m, p - s) warm-up forwards, "
            "then one backward and one forward while forwards remain, then the other backwards: torch's "
            "Schedule1F1B._step_microbatches (Megatron-LM states the same order as p - s - 1 warm-up forwards, "
            "then one forward and one backward)",
    "interleaved-1f1b": "interleaved 1F1B (Narayanan et al. 2021, arXiv:2104.04473 §2.2.2): each device holds "
                        "`chunks` non-consecutive stages (virtual stages); torch's ScheduleInterleaved1F1B",
    "zero-bubble": "ZB-H1 (Qi et al. 2023, 'Zero Bubble Pipeline Parallelism', arXiv:2401.10241, its handcrafted "
                   "memory-efficient schedule): backward split into B (input gradient) and W (weight gradient), W "
                   "filling the bubbles; the op order of torch's ScheduleInterleavedZeroBubble with one stage per "
                   "device (torch: 'the ZB1P schedule in the paper')",
}

_OP_KINDS = ("F", "B", "W")


def _real(x) -> bool:
    """A finite real number (numpy's too), not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _seconds(x, what: str, *, positive: bool) -> float:
    if not _real(x):
        raise ValueError(f"{what} must be a finite number, not {x!r}")
    if x < 0 or (positive and x == 0):
        raise ValueError(f"{what} must be {'> 0' if positive else '>= 0'}, not {x!r}")
    return float(x)


# ---------------------------------------------------------------------------------------------------- schedules


@dataclass(frozen=True)
class Op:
    """One piece of a pipeline schedule: a micro-batch's forward or backward through one stage (notebook 07).

    kind: "F" forward; "B" backward (for zero bubble: the input gradient only); "W" the weight gradient (zero
    bubble only). stage: the model's stage, counted from the input; in interleaved 1F1B a virtual stage (device d
    holds stages d, d + p, d + 2p, ... of p·chunks). device: the device that runs it (the stage itself unless
    interleaved), chunk: which of its device's stages it is (0 unless interleaved). start, end: in any one unit.
    """

    stage: int
    micro_batch: int
    kind: str
    start: float
    end: float
    device: int | None = None
    chunk: int = 0

    def __post_init__(self):
        if self.kind not in _OP_KINDS:
            raise ValueError(f"kind must be one of {', '.join(_OP_KINDS)}, not {self.kind!r}")
        for name in ("stage", "micro_batch", "chunk"):
            whole_number(getattr(self, name), name, 0, integral_floats=False)
        if self.device is None:
            object.__setattr__(self, "device", self.stage)
        whole_number(self.device, "device", 0, integral_floats=False)
        if not (_real(self.start) and _real(self.end) and self.end >= self.start):
            raise ValueError(f"need finite times with end >= start, not start={self.start!r}, end={self.end!r}")

    @property
    def duration(self) -> float:
        return self.end - self.start


def _device_orders(kind: str, p: int, m: int, v: int) -> list[list[tuple[int, int, str]]]:
    """The ops each device runs, in the order it runs them: (stage, micro-batch, kind)."""
    orders = []
    for d in range(p):
        if kind == "gpipe":  # torch's ScheduleGPipe: all forwards, then the backwards in the same order
            order = [(d, i, "F") for i in range(m)] + [(d, i, "B") for i in range(m)]
        elif kind == "1f1b":  # torch's Schedule1F1B: min(m, p − d) forwards, then B, F, B, F, ..., then the rest of B
            warmup = min(m, p - d)
            order = [(d, i, "F") for i in range(warmup)]
            for i in range(m):
                order.append((d, i, "B"))
                if warmup + i < m:
                    order.append((d, warmup + i, "F"))
        else:  # torch's _get_1f1b_rank_ops, as ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble call it
            zero_bubble = kind == "zero-bubble"
            # warm-up forwards: (v − 1)·p + 2(p − 1 − d) for interleaved (Megatron-LM's), p − 1 − d for ZB-H1
            warmup = min((v - 1) * p + (1 if zero_bubble else 2) * (p - 1 - d), m * v)
            delayed_w = d if zero_bubble else None  # ZB-H1: device d holds back its first d weight gradients
            next_mb: dict[tuple[int, str], int] = {}

            def take(stage, what):
                i = next_mb.get((stage, what), 0)
                next_mb[(stage, what)] = i + 1
                return stage, i, what

            def forward_stage(step):
                return ((step // p) % v) * p + d

            def backward_stage(step):
                return (v - 1 - ((step - warmup) // p) % v) * p + d

            order, backwards, weights_done = [], [], 0
            for step in range(m * v + warmup):  # warm-up forwards, m·v − warmup pairs F B, warmup cool-down B
                if step < m * v:
                    order.append(take(forward_stage(step), "F"))
                if step >= warmup:
                    order.append(take(backward_stage(step), "B"))
                    backwards.append(backward_stage(step))
                    if zero_bubble and step - warmup >= delayed_w:
                        order.append(take(backwards[weights_done], "W"))
                        weights_done += 1
            if zero_bubble:
                order += [take(stage, "W") for stage in backwards[weights_done:]]
        orders.append(order)
    return orders


def _checked_settings(kind, stages, micro_batches, chunks, forward_time, backward_time, comm_time):
    """simulate's settings checked: (p, m, v, each op kind's duration, comm_time), or the error that says why not."""
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a schedule's name, one of {', '.join(map(repr, KINDS))}, not "
                        f"{type(kind).__name__}")
    if kind not in KINDS:
        raise ValueError(f"unknown schedule {kind!r}: use one of {', '.join(map(repr, KINDS))}")
    p = whole_number(stages, "stages")
    m = whole_number(micro_batches, "micro_batches")
    v = whole_number(chunks, "chunks")
    f = _seconds(forward_time, "forward_time", positive=True)
    b = _seconds(backward_time, "backward_time", positive=True)
    c = _seconds(comm_time, "comm_time", positive=False)
    if kind != "interleaved-1f1b" and v != 1:
        raise ValueError(f"chunks (stages per device) is for 'interleaved-1f1b' only; {kind!r} has 1 per device, "
                         f"not {v}")
    if kind == "interleaved-1f1b" and m % p:
        raise ValueError(f"interleaved 1F1B takes micro-batches in rounds of one per device: micro_batches must be a "
                         f"multiple of stages ({p}), not {m}; try {p * max(1, round(m / p))}")
    duration = {"F": f / v, "B": b / v, "W": 0.0}
    if kind == "zero-bubble":
        duration["B"] = duration["W"] = b / 2
    return p, m, v, duration, c


def _input_of(stage: int, i: int, what: str, last: int) -> tuple[int, int, str] | None:
    """The op whose result this one needs: F of the stage before, B of the stage after (the last stage's B: its own
    F), W its own B; None for the first stage's F."""
    if what == "F":
        return (stage - 1, i, "F") if stage > 0 else None
    if what == "B":
        return (stage + 1, i, "B") if stage < last else (stage, i, "F")
    return (stage, i, "B")


def simulate(kind: str, stages: int, micro_batches: int, *, forward_time: float = 1.0, backward_time: float = 2.0,
             chunks: int = 1, comm_time: float = 0.0) -> list[Op]:
    """Play out a pipeline schedule op by op; return every op with its start and end (notebook 07).

    kind: "gpipe", "1f1b", "interleaved-1f1b" or "zero-bubble" (KINDS says where each comes from); stages: p
    devices; micro_batches: m. forward_time, backward_time: one micro-batch through one device's share of the model
    (backward about twice forward: it computes the gradient of the input and of the weights). chunks (interleaved
    only): v stages per device, each 1/v of the device's layers, so each of its ops takes 1/v of the time. For zero
    bubble the backward is split into B (input gradient) and W (weight gradient), each half of backward_time.

    Each device runs its ops in the schedule's order (torch's order for each kind), each as soon as the device is
    free and its input is there: F of stage s after F of stage s − 1 has ended plus comm_time (the activation's
    trip), B of stage s after B of stage s + 1 plus comm_time (the gradient's trip back), B of the last stage after
    its own F, W after its B. Nothing is sent between two stages on the same device. Ops come back sorted by start.

    An event-driven simulation with fixed op times. torch's Schedule1F1B refuses m < p; simulate runs it (GPipe's
    bubble, in another order). Interleaved 1F1B needs micro_batches a multiple of stages: its schedule takes the
    micro-batches in rounds of p (Narayanan et al. §2.2.2; Megatron-LM refuses other counts). torch 2.14's
    ScheduleInterleaved1F1B is looser: max(1, m // p) rounds, m a multiple of the number of rounds.
    """
    p, m, v, duration, c = _checked_settings(kind, stages, micro_batches, chunks, forward_time, backward_time,
                                             comm_time)
    last = p * v - 1
    orders = _device_orders(kind, p, m, v)
    ends: dict[tuple[int, int, str], float] = {}
    ops: list[Op] = []
    position, free = [0] * p, [0.0] * p

    def ready(stage: int, i: int, what: str) -> float | None:
        """When the op's input is on its device; None while it is not computed yet."""
        before = _input_of(stage, i, what, last)
        if before is None:
            return 0.0
        if before not in ends:
            return None
        moved = before[0] % p != stage % p  # from another device: one transfer
        return ends[before] + (c if moved else 0.0)

    progress = True
    while progress:
        progress = False
        for d in range(p):
            while position[d] < len(orders[d]):
                stage, i, what = orders[d][position[d]]
                arrival = ready(stage, i, what)
                if arrival is None:
                    break  # waits for another device
                start = max(free[d], arrival)
                end = start + duration[what]
                ends[(stage, i, what)] = end
                ops.append(Op(stage, i, what, start, end, device=d, chunk=stage // p))
                free[d] = end
                position[d] += 1
                progress = True
    if any(position[d] < len(orders[d]) for d in range(p)):  # a schedule whose order waits on itself
        raise RuntimeError(f"the {kind} schedule deadlocked at p={p}, m={m}, chunks={v}: a bug in the schedule")
    return sorted(ops, key=lambda op: (op.start, op.device))


def _check_ops(ops) -> list[Op]:
    ops = list(ops)
    if not ops:
        raise ValueError("ops is empty: pass what simulate() or timeline_of_naive_split() returned")
    for op in ops:
        if not isinstance(op, Op):
            raise TypeError(f"ops must be Op objects (from simulate), not {type(op).__name__}")
    return ops


def makespan(ops: Sequence[Op]) -> float:
    """Time from the first op's start to the last op's end: one training step's pipeline (notebook 07)."""
    ops = _check_ops(ops)
    return max(op.end for op in ops) - min(op.start for op in ops)


def bubble(ops: Sequence[Op]) -> float:
    """The idle fraction of device time between the first start and the last end, over every device (notebook 07).

    1 − (time spent in ops) / (devices × makespan): GPipe's "bubble" as a fraction of the total time. A device
    counts if it runs at least one op. 0 for a schedule that never waits.
    """
    ops = _check_ops(ops)
    span = makespan(ops)
    if span == 0:
        return 0.0
    devices = {op.device for op in ops}
    return max(0.0, 1.0 - sum(op.duration for op in ops) / (len(devices) * span))


def peak_in_flight(ops: Sequence[Op]) -> dict[int, int]:
    """Per device, the most micro-batches forwarded but not yet backwarded: the activations it holds (notebook 07).

    A micro-batch's activations on a stage are kept from its forward's start until its last backward op there ends
    (W where the backward is split: the weight gradient still needs the layer inputs). GPipe holds all m; 1F1B at
    most p on the first device. In interleaved 1F1B each count is one (micro-batch, chunk) pair, which holds 1/chunks
    of a micro-batch's activations on that device: divide by chunks for micro-batches' worth.
    """
    ops = _check_ops(ops)
    release = {}
    for op in ops:  # the op that ends each (stage, micro-batch)'s life: its W if it has one, else its B
        key = (op.stage, op.micro_batch)
        if op.kind == "W" or (op.kind == "B" and release.get(key) != "W"):
            release[key] = op.kind
    held: dict[int, int] = {}
    peak: dict[int, int] = {}
    for op in sorted(ops, key=lambda o: (o.start, o.end)):
        peak.setdefault(op.device, 0)
        if op.kind == "F":
            held[op.device] = held.get(op.device, 0) + 1
            peak[op.device] = max(peak[op.device], held[op.device])
        elif release.get((op.stage, op.micro_batch)) == op.kind:
            held[op.device] = held.get(op.device, 0) - 1
    return dict(sorted(peak.items()))


# ---------------------------------------------------------------------------------------------------- formulas


def _p_m(p, m) -> tuple[int, int]:
    return whole_number(p, "p (stages)"), whole_number(m, "m (micro-batches)")


def gpipe_bubble(p: int, m: int) -> float:
    """(p − 1) / (m + p − 1): the bubble as a fraction of the total time, GPipe and 1F1B alike (notebook 07).

    Huang et al. 2019, GPipe, arXiv:1811.06965 §2.3: "This bubble time is O((K−1)/(M+K−1))" (K partitions, M
    micro-batches), "negligible when M ≥ 4 × K": each device is idle p − 1 of the m + p − 1 forward slots, and
    again of the backward ones. simulate() gives exactly this for GPipe and 1F1B, whatever the forward and backward
    times, when nothing is sent (comm_time 0).
    """
    p, m = _p_m(p, m)
    return (p - 1) / (m + p - 1)


def interleaved_bubble(p: int, m: int, v: int = 1) -> float:
    """(p − 1) / (v·m): interleaved 1F1B's bubble as a ratio to the ideal time, NOT to the total (notebook 07).

    Narayanan et al. 2021, arXiv:2104.04473 §2.2: the bubble of 1F1B is (p − 1)(t_f + t_b), the ideal time
    m(t_f + t_b), so "bubble time fraction" = (p − 1)/m; with v stages per device each op is v times shorter and the
    bubble is (1/v)(p − 1)/m. v = 1 is plain 1F1B (and GPipe). as_fraction_of_total turns it into gpipe_bubble's
    measure: (p − 1)/(v·m + p − 1). simulate("interleaved-1f1b", ...) gives exactly this (m a multiple of p,
    comm_time 0, whatever the forward and backward times).
    """
    p, m = _p_m(p, m)
    v = whole_number(v, "v (chunks per device)")
    return (p - 1) / (v * m)


def as_fraction_of_total(ratio_to_ideal: float) -> float:
    """bubble/ideal → bubble/total: r / (1 + r), since total = ideal + bubble (notebook 07)."""
    r = _seconds(ratio_to_ideal, "ratio_to_ideal", positive=False)
    return r / (1 + r)


def as_ratio_to_ideal(fraction_of_total: float) -> float:
    """bubble/total → bubble/ideal: f / (1 − f); the inverse of as_fraction_of_total (notebook 07)."""
    f = _seconds(fraction_of_total, "fraction_of_total", positive=False)
    if f >= 1:
        raise ValueError(f"fraction_of_total must be below 1 (a bubble is part of the total), not {f!r}")
    return f / (1 - f)

