"""Links as the ring all-reduce sees them: latency α and bus bandwidth, with sources; the α–β time of an all-reduce,
and a link fitted to a measured sweep (notebook 05; lesson 04's cost model, applied to real interconnects).

    Link, LINKS                       a link's latency α and bus bandwidth, with where each figure comes from
    all_reduce_time(nbytes, n, link)  the ring all-reduce of lesson 04's α–β model, in the link's bus bandwidth
    fit_link(sizes, seconds, n)       a Link fitted to an all-reduce sweep (least squares on relative errors)

DDP's step model (course_lib.parallel.ddp) and lesson 09's planner price their communication with these.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass
from typing import Sequence

from course_lib.tables import plural

__all__ = ["Link", "LINKS", "all_reduce_time", "fit_link"]


def _real(x) -> bool:
    """A finite real number (numpy's too), not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Link:
    """A link as the ring all-reduce sees it: latency per message and bus bandwidth, with sources (notebook 05).

    alpha_s: seconds per message (one step of the ring). bandwidth_Bps: bytes per second of *bus* bandwidth,
    nccl-tests' busbw (doc/PERFORMANCE.md in NVIDIA/nccl-tests: busbw = algbw · 2(n−1)/n for all-reduce), so a
    figure read off an all_reduce_perf run plugs straight in. source: where each figure comes from, or the words
    saying that it is an assumption. A ring that crosses several kinds of link goes at the pace of the slowest:
    model it with that one (across machines, the network).
    """

    name: str
    alpha_s: float
    bandwidth_Bps: float
    source: str

    def __post_init__(self):
        if not (_real(self.alpha_s) and self.alpha_s >= 0):
            raise ValueError(f"{self.name}: alpha_s must be a finite number of seconds >= 0, not {self.alpha_s!r}")
        if not (_real(self.bandwidth_Bps) and self.bandwidth_Bps > 0):
            raise ValueError(f"{self.name}: bandwidth_Bps must be a finite number of bytes/s > 0, "
                             f"not {self.bandwidth_Bps!r}")

    @property
    def summary(self) -> str:
        """One line: name, α in µs, bus bandwidth in GB/s (10⁹ bytes per second, as nccl-tests prints it)."""
        return f"{self.name}: α {self.alpha_s * 1e6:.3g} µs, busbw {self.bandwidth_Bps / 1e9:.3g} GB/s"


_NVLINK_ALPHA = ("α assumed 2.5 µs per ring step, not measured on this link: it is the α that fit_link gives for "
                 "the 8×A100 NVLink run in course_lib/nccl_logs.py (ONE_MACHINE), the only small-message log at hand")
_NETWORK_ALPHA = "α assumed 10 µs per message, an order of magnitude for a hop between machines; not measured"

# Every figure is sourced or labelled an assumption, in its Link's `source`. Bus bandwidths are what an all-reduce
# achieves on large messages, not the line rate, except where the source says it is the line rate.
LINKS: dict[str, Link] = {link.name: link for link in [
    Link("NVLink, 8×H100 node", 2.5e-6, 370e9,
         "line rate: NVIDIA's H100 Tensor Core GPU datasheet gives H100 SXM 900 GB/s of NVLink (both directions "
         "together: 450 GB/s each way) and 128 GB/s of PCIe Gen5 (H100 NVL: 600 GB/s NVLink); a datasheet gives "
         "no all-reduce figure. busbw 370 GB/s: what NCCL's ring achieves on NVLink4 (the 450 GB/s line rate "
         "less about 20% protocol overhead), NCCL maintainer in NVIDIA/nccl-tests#212. NVLink SHARP (NVLS), NCCL's "
         "default all-reduce there, reaches a busbw of about 480 GB/s on 8 GPUs for messages well above 256 MB "
         "(same thread; 476 GB/s measured in NVIDIA/nccl-tests#290). " + _NVLINK_ALPHA),
    Link("NVLink, 8×A100 node (fitted to a real log)", 2.5e-6, 207e9,
         "α 2.5 µs and busbw 207 GB/s: fit_link over the out-of-place rows (64 B to 8 GiB) of the all_reduce_perf "
         "run on 8 A100-SXM4-40GB in course_lib/nccl_logs.py (ONE_MACHINE, from oracle-japan/ocitutorials); its "
         "printed busbw peaks at 235 GB/s"),
    Link("PCIe 4.0 x16", 5e-6, 31.5e9,
         "31.5 GB/s is the LINE RATE of one direction, an upper bound no all-reduce reaches: 16 GT/s per lane × 16 "
         "lanes × 128/130 (encoding) / 8 bits (PCI Express Base Specification 4.0, PCI-SIG). α assumed 5 µs per "
         "message, an order of magnitude; not measured"),
    Link("400 Gb/s network (NDR InfiniBand)", 10e-6, 47e9,
         "busbw 47 GB/s: 46–48 GB/s per NDR 400 Gb/s NIC, NCCL maintainer in NVIDIA/nccl-tests#290; this is a "
         "ring whose slowest hop is one such NIC per machine (with k NICs per machine NCCL spreads its rings over "
         "them, up to k times as much). " + _NETWORK_ALPHA),
    Link("100 Gb/s network", 10e-6, 12.2e9,
         "busbw 12.2 GB/s: 'as good as you can get' for one 100 Gb/s card, NCCL maintainer in "
         "NVIDIA/nccl-tests#29 (the line rate is 12.5 GB/s); one such NIC per machine. " + _NETWORK_ALPHA),
]}


def _count(n, what: str = "n") -> int:
    """n as an int, by the course's rule for counts (course_lib.parallel.whole_number): an int (numpy's integers
    too) or an integral float such as 4096.0; a bool, a fraction, nan, inf or anything else is a ValueError."""
    if isinstance(n, numbers.Integral) and not isinstance(n, bool):
        return operator.index(n)
    if _real(n) and float(n).is_integer():
        return int(n)
    raise ValueError(f"{what} must be a whole number (an int, or an integral float such as 4096.0), not {n!r}")


def _ranks(n) -> int:
    n = _count(n, "the number of ranks n")
    if n < 1:
        raise ValueError(f"need 1 or more ranks, not {n}")
    return n


def all_reduce_time(nbytes: float, n: int, link: Link) -> float:
    """Seconds for a ring all-reduce of nbytes (one rank's tensor) over n ranks (notebook 05).

    t = 2(n−1)α + 2(n−1)/n · nbytes / busbw: lesson 04's α–β model with β = 1 / bus bandwidth. By nccl-tests'
    definition busbw = algbw · 2(n−1)/n = nbytes / t · 2(n−1)/n, so with α = 0 a link's measured busbw gives back
    exactly the time it was measured from. One rank: no message, no time.
    """
    n = _ranks(n)
    if not (_real(nbytes) and nbytes >= 0):
        raise ValueError(f"nbytes must be a finite number >= 0, not {nbytes!r}")
    if not isinstance(link, Link):
        raise ValueError(f"link must be a Link, not {type(link).__name__}")
    if n == 1:
        return 0.0
    return 2 * (n - 1) * link.alpha_s + 2 * (n - 1) / n * nbytes / link.bandwidth_Bps


def fit_link(sizes_bytes: Sequence[float], seconds: Sequence[float], world_size: int,
             name: str = "your machine", *, source: str | None = None) -> Link:
    """The Link whose ring all-reduce best matches a measured sweep: least squares on relative errors (notebook 05).

    Fits t ≈ a + b·S to (size, time) pairs, each row divided by its own t so that small sizes count as much as
    large ones (notebook 04 does the same), then reads α = a / (2(n−1)) and busbw = 2(n−1) / (n·b) off the line.
    Raises ValueError for bad inputs (fewer than two distinct sizes, lengths that differ, times <= 0, a world of one
    rank) and when the fitted α or bandwidth is not positive: the sweep is then too noisy or too narrow to read.
    """
    import numpy as np

    n = _count(world_size, "world_size")
    if n < 2:
        raise ValueError(f"a fit needs an all-reduce between 2 or more ranks, not world_size={n}")
    sizes, times = list(sizes_bytes), list(seconds)
    if len(sizes) != len(times):
        raise ValueError(f"{plural(len(sizes), 'size')} but {plural(len(times), 'time')}: one time per size")
    for s, t in zip(sizes, times):
        if not (_real(s) and s >= 0):
            raise ValueError(f"sizes must be finite numbers of bytes >= 0, not {s!r}")
        if not (_real(t) and t > 0):
            raise ValueError(f"times must be finite numbers of seconds > 0, not {t!r}")
    if len(set(sizes)) < 2:
        raise ValueError(f"a line needs 2 or more distinct sizes, got {plural(len(set(sizes)), 'size')}")
    s = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    scale = s.max()  # columns of similar magnitude keep the solve well conditioned
    design = np.stack([np.ones_like(s), s / scale], axis=1) / t[:, None]
    (a, b_scaled), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    b = b_scaled / scale
    if not (a > 0 and b > 0):
        raise ValueError(f"the fit is not physical: latency term {a:.3g} s and per-byte term {b:.3g} s/B must both be "
                         "> 0; the sweep is too noisy or too narrow: measure again, from small sizes to large ones")
    alpha = float(a) / (2 * (n - 1))
    bandwidth = 2 * (n - 1) / (n * float(b))
    if source is None:
        source = (f"fitted to your all-reduce sweep: {plural(len(sizes), 'size')}, {plural(n, 'rank')} "
                  "(least squares on relative errors)")
    return Link(name, alpha, bandwidth, source)
