"""course_lib.parallel.ddp: notebook 05's model of a DDP step, against torch's own bucketing and plain arithmetic."""

from __future__ import annotations

import dataclasses
import logging

import matplotlib
import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from course_lib.nccl_logs import ONE_MACHINE
from course_lib.parallel.ddp import (LINKS, MODELS, Link, StepEstimate, all_reduce_time, bucket_schedule, bucket_sizes,
                                     ddp_explorer, ddp_step_time, fit_link, parameter_bytes, scaling_curve)
from course_lib.sliders import browser_start

matplotlib.use("Agg")
MIB = 1024 * 1024
FAST = settings(max_examples=60, deadline=None)

grad_lists = st.lists(st.one_of(st.integers(0, 4096), st.integers(0, 3 * MIB), st.integers(0, 60 * MIB)),
                      max_size=25)
caps = st.one_of(st.sampled_from([0, 0.5, 1, 25, 100]), st.floats(0, 64, allow_nan=False))
links = st.builds(lambda a, b: Link("drawn", a, b, "a Hypothesis example"),
                  st.floats(0, 1e-3), st.floats(1e8, 1e12))


def torch_buckets(sizes, cap_mb, first_mb):
    """Bytes per bucket as DDP's C++ assignment makes them, for gradients ready in reverse registration order."""
    if not sizes:
        return []
    ready_order = [torch.empty(n, dtype=torch.uint8, device="meta") for n in reversed(sizes)]
    indices, _ = dist._compute_bucket_assignment_by_size(ready_order, [int(first_mb * MIB), int(cap_mb * MIB)])
    return [sum(ready_order[i].numel() for i in bucket) for bucket in indices]


def ring(nbytes, n, alpha, bandwidth):
    return 0.0 if n == 1 else 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / bandwidth


# ------------------------------------------------------------------------------------------- links and the ring


def test_all_reduce_time_is_the_ring_model_and_agrees_with_the_busbw_definition():
    link = Link("test", 5e-6, 100e9, "made up for the test")
    assert all_reduce_time(2**20, 4, link) == pytest.approx(2 * 3 * 5e-6 + 2 * 3 / 4 * 2**20 / 100e9, rel=1e-12)
    assert all_reduce_time(2**30, 1, link) == 0.0
    assert all_reduce_time(0, 8, link) == pytest.approx(14 * 5e-6)
    no_latency = Link("test", 0.0, 100e9, "made up")
    for n in (2, 3, 8, 64):
        t = all_reduce_time(2**30, n, no_latency)
        busbw = 2**30 / t * 2 * (n - 1) / n  # nccl-tests' doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n
        assert busbw == pytest.approx(100e9)
    for bad in [(-1, 2, link), (10, 0, link), (10, 2.5, link), (10, 2, "NVLink"), (float("nan"), 2, link)]:
        with pytest.raises(ValueError):
            all_reduce_time(*bad)


def test_link_rejects_impossible_figures():
    for alpha, bandwidth in [(-1e-6, 1e9), (1e-6, 0), (1e-6, -5), (float("inf"), 1e9), (1e-6, float("nan"))]:
        with pytest.raises(ValueError):
            Link("bad", alpha, bandwidth, "test")
    with pytest.raises(dataclasses.FrozenInstanceError):
        LINKS["100 Gb/s network"].alpha_s = 0.0


def test_every_preset_figure_is_sourced_or_labelled_an_assumption():
    for name, link in LINKS.items():
        assert link.name == name and len(link.source) > 40
        text = link.source
        assert "α" in text and ("assumed" in text or "fit_link" in text), f"{name}: where does α come from?"
    h100 = LINKS["NVLink, 8×H100 node"]
    assert h100.bandwidth_Bps == 370e9 and "NVIDIA/nccl-tests#212" in h100.source and "480" in h100.source
    assert "datasheet" in h100.source and "900 GB/s" in h100.source  # the line rate from NVIDIA's own sheet
    ndr = LINKS["400 Gb/s network (NDR InfiniBand)"]
    assert 46e9 <= ndr.bandwidth_Bps <= 48e9 and "NVIDIA/nccl-tests#290" in ndr.source
    ethernet = LINKS["100 Gb/s network"]
    assert ethernet.bandwidth_Bps <= 100e9 / 8 and "NVIDIA/nccl-tests#29 " in ethernet.source
    pcie = LINKS["PCIe 4.0 x16"]
    assert pcie.bandwidth_Bps == pytest.approx(16e9 * 16 * 128 / 130 / 8, rel=1e-3)  # the spec's line rate
    assert "LINE RATE" in pcie.source


def test_the_default_figures_are_the_documented_ones():
    from course_lib.parallel import ddp

    assert ddp.BACKWARD_FRACTION == pytest.approx(2 / 3)  # backward ≈ 2 × forward FLOPs (Kaplan et al. 2020 §2.1)
    assert ddp.DEFAULT_COMPUTE_MS == 34.5  # the course's ResNet-50 bf16 step on a lent H100 (design notes)
    step = ddp_step_time([4 * MIB], 0.03, 2, LINKS["100 Gb/s network"])
    assert step == ddp_step_time([4 * MIB], 0.03, 2, LINKS["100 Gb/s network"], backward_fraction=2 / 3)


def test_the_a100_preset_is_what_fit_link_makes_of_the_real_log():
    rows = [line.split() for line in ONE_MACHINE.splitlines()]
    rows = [(int(f[0]), float(f[5]) * 1e-6) for f in rows if len(f) == 13 and f[0].isdigit()]  # out-of-place time
    fitted = fit_link([s for s, _ in rows], [t for _, t in rows], 8)
    preset = LINKS["NVLink, 8×A100 node (fitted to a real log)"]
    assert fitted.alpha_s == pytest.approx(preset.alpha_s, rel=0.02)
    assert fitted.bandwidth_Bps == pytest.approx(preset.bandwidth_Bps, rel=0.01)


@FAST
@given(alpha=st.floats(1e-7, 1e-3), bandwidth=st.floats(1e8, 1e12), n=st.integers(2, 64),
       sizes=st.lists(st.integers(0, 2**31), min_size=2, max_size=12, unique=True).filter(
           lambda s: max(s) >= 2**20))
def test_fit_link_recovers_alpha_and_bandwidth_from_a_noiseless_sweep(alpha, bandwidth, n, sizes):
    times = [ring(s, n, alpha, bandwidth) for s in sizes]
    link = fit_link(sizes, times, n, "synthetic")
    assert isinstance(link, Link) and link.name == "synthetic" and "fitted" in link.source
    assert link.alpha_s == pytest.approx(alpha, rel=1e-6)
    # the bandwidth term is only readable where it is a visible share of some time: otherwise the fit is loose
    share = max(ring(s, n, 0.0, bandwidth) / ring(s, n, alpha, bandwidth) for s in sizes)
    assert link.bandwidth_Bps == pytest.approx(bandwidth, rel=1e-6 / share + 1e-9)


def test_fit_link_on_a_noisy_sweep_is_close_and_keeps_the_inputs():
    sizes = [2**k for k in range(6, 28, 2)]
    noise = [1.03, 0.97, 1.02, 0.99, 1.01, 0.98, 1.03, 0.97, 1.0, 1.02, 0.98]
    times = [ring(s, 4, 40e-6, 2e9) * e for s, e in zip(sizes, noise)]
    before = (list(sizes), list(times))
    link = fit_link(sizes, times, 4)
    assert (sizes, times) == before
    as_numpy = fit_link(np.array(sizes), np.array(times), np.int64(4))  # numpy's numbers are numbers too
    assert (as_numpy.alpha_s, as_numpy.bandwidth_Bps) == pytest.approx((link.alpha_s, link.bandwidth_Bps))
    assert link.alpha_s == pytest.approx(40e-6, rel=0.1)
    assert link.bandwidth_Bps == pytest.approx(2e9, rel=0.1)


@pytest.mark.parametrize("sizes, seconds, world_size", [
    ([1, 2, 3], [1e-3, 2e-3], 2),                 # lengths differ
    ([1024, 1024], [1e-3, 1.1e-3], 2),             # one distinct size
    ([1024], [1e-3], 2),                           # one point
    ([1024, 4096], [1e-3, 0.0], 2),                # a time of zero
    ([1024, 4096], [1e-3, -2e-3], 2),              # a negative time
    ([-8, 4096], [1e-3, 2e-3], 2),                 # a negative size
    ([1024, 4096], [1e-3, float("nan")], 2),       # not a number
    ([1024, 4096], [1e-3, 2e-3], 1),               # one rank: nothing to fit
    ([1024, 4096], [1e-3, 2e-3], 2.5),             # not a whole number of ranks
    ([1024, 2**20, 2**24], [3e-3, 2e-3, 1e-3], 2),  # slower for smaller sizes: negative bandwidth
    ([2**20, 2**24, 2**26], [5.5e-5, 1.628e-3, 6.661e-3], 2),  # a line below the origin: alpha < 0
])
def test_fit_link_rejects_bad_inputs_and_unphysical_fits(sizes, seconds, world_size):
    with pytest.raises(ValueError):
        fit_link(sizes, seconds, world_size)


# ------------------------------------------------------------------------------------------------------ buckets


@settings(max_examples=120, deadline=None)
@given(sizes=grad_lists, cap=caps, first=caps)
def test_bucket_sizes_are_torch_s_bucket_assignment(sizes, cap, first):
    before = list(sizes)
    got = bucket_sizes(sizes, bucket_cap_mb=cap, first_bucket_mb=first)
    assert sizes == before
    assert got == torch_buckets(sizes, cap, first)
    assert sum(got) == sum(sizes) and all(isinstance(b, int) for b in got)
    limits = [int(first * MIB)] + [int(cap * MIB)] * len(got)
    assert all(b >= limit for b, limit in zip(got[:-1], limits)), "every bucket but the last is full"


def test_bucket_sizes_by_hand_and_bad_inputs():
    mib = MIB
    # reverse order: 3 MiB alone passes the 1 MiB first bucket; then 20 + 10 MiB pass 25 MiB; 2 MiB is left
    assert bucket_sizes([2 * mib, 10 * mib, 20 * mib, 3 * mib]) == [3 * mib, 30 * mib, 2 * mib]
    assert bucket_sizes([2 * mib, 10 * mib, 20 * mib, 3 * mib], 25, first_bucket_mb=25) == [33 * mib, 2 * mib]
    assert bucket_sizes([5, 6, 7], 0, first_bucket_mb=0) == [7, 6, 5]  # a cap of 0: one bucket per parameter
    assert bucket_sizes([]) == []
    assert bucket_sizes([4096.0, 2.0**20, 7]) == bucket_sizes([4096, 2**20, 7])  # sizes are counts: 4096.0 is one
    for bad in [([-1],), ([1.5],), ([True],), ([float("inf")],), ([4], -1), ([4], 25, float("nan")), ([4], "25")]:
        with pytest.raises(ValueError):
            bucket_sizes(*bad)


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.frozen = nn.Linear(16, 16)
        self.frozen.requires_grad_(False)
        self.mid = nn.Linear(16, 32, dtype=torch.bfloat16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight  # tied: one tensor, two names

    def forward(self, x):
        h = self.frozen(self.embed(x))
        return self.head(h) + self.mid(h.bfloat16()).float().sum(-1, keepdim=True)


def test_parameter_bytes_counts_a_tied_weight_once_and_skips_frozen_ones():
    assert parameter_bytes(TiedLM()) == [50 * 16 * 4, 32 * 16 * 2, 32 * 2]


def test_bucket_sizes_are_the_buckets_ddp_all_reduces_after_its_first_iteration(tmp_path):
    """A real DDP (world of one, gloo, in this process): a comm hook records each bucket's bytes per iteration."""
    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(300, 600), nn.ReLU(), nn.Linear(600, 700), nn.Linear(700, 900),
                             nn.Linear(900, 10))

    def record(**kw):
        ddp = nn.parallel.DistributedDataParallel(model(), **kw)
        seen = []

        def hook(state, bucket):
            seen[-1].append(bucket.buffer().numel() * bucket.buffer().element_size())
            future = torch.futures.Future()
            future.set_result(bucket.buffer())
            return future

        ddp.register_comm_hook(None, hook)
        for _ in range(3):
            seen.append([])
            ddp(torch.randn(4, 300)).sum().backward()
        return seen

    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        grads = parameter_bytes(model())
        by_default = record()
        explicit = record(bucket_cap_mb=25), record(bucket_cap_mb=1)
    finally:
        dist.destroy_process_group()
    assert by_default[0] == [sum(grads)], "the first iteration all-reduces one bucket"
    assert by_default[1] == by_default[2] == bucket_sizes(grads) and len(by_default[1]) == 2
    # bucket_cap_mb passed explicitly, even DDP's own default of 25, sizes the first bucket too
    assert explicit[0][2] == bucket_sizes(grads, 25, first_bucket_mb=25) == [sum(grads)]
    assert explicit[1][2] == bucket_sizes(grads, 1, first_bucket_mb=1) and len(explicit[1][2]) == 3


def test_models_are_the_networks_they_are_named_after():
    assert len(MODELS["ResNet-18 (11.7M)"]) == 62 and sum(MODELS["ResNet-18 (11.7M)"]) == 4 * 11_689_512
    assert len(MODELS["ResNet-50 (25.6M)"]) == 161 and sum(MODELS["ResNet-50 (25.6M)"]) == 4 * 25_557_032
    assert MODELS["ResNet-50 (25.6M)"][-2:] == [4 * 2048 * 1000, 4 * 1000]  # fc, registered last
    gpt = MODELS["GPT, 1.3B (GPT-3 XL shape)"]
    assert 1.25e9 < sum(gpt) / 4 < 1.35e9 and gpt[0] == 4 * 50257 * 2048


# --------------------------------------------------------------------------------------------------- the step


def reference_step(sizes, compute, n, link, cap, first, overlap, backward_fraction):
    """The step played out bucket by bucket, from torch's buckets and the ring written out here."""
    if n == 1:
        return compute, 0.0
    buckets = torch_buckets(sizes, cap, first)
    forward = (1 - backward_fraction) * compute
    total, produced, free, comm = sum(buckets), 0, 0.0, 0.0
    for b in buckets:
        produced += b
        ready = forward + backward_fraction * compute * (produced / total if total else 1.0)
        start = max(ready if overlap else compute, free)
        took = ring(b, n, link.alpha_s, link.bandwidth_Bps)
        free, comm = start + took, comm + took
    return max(compute, free), comm


def test_ddp_step_time_by_hand():
    link = Link("test", 10e-6, 10e9, "made up")
    # one 8 MiB bucket, ready at the end of backward: overlap cannot help
    for overlap in (True, False):
        est = ddp_step_time([8 * MIB], 0.030, 4, link, overlap=overlap)
        comm = 6 * 10e-6 + 1.5 * 8 * MIB / 10e9
        assert est == StepEstimate(0.030, pytest.approx(comm), pytest.approx(comm), pytest.approx(0.030 + comm),
                                   pytest.approx(0.030 / (0.030 + comm)))
    # two buckets, 30 MiB (first, in reverse order) and 2 MiB, backward 20 of 30 ms: the first all-reduce runs
    # from 10 + 20 * 30/32 = 28.75 ms to 28.75 + t(30 MiB); the second waits for it
    t30, t2 = ring(30 * MIB, 2, 10e-6, 10e9), ring(2 * MIB, 2, 10e-6, 10e9)
    est = ddp_step_time([2 * MIB, 30 * MIB], 0.030, 2, link, overlap=True)
    assert est.step_s == pytest.approx(0.010 + 0.020 * 30 / 32 + t30 + t2)
    assert est.comm_s == pytest.approx(t30 + t2)
    assert ddp_step_time([2 * MIB, 30 * MIB], 0.030, 2, link, overlap=False).step_s == pytest.approx(0.030 + t30 + t2)


@FAST
@given(sizes=grad_lists, compute=st.floats(1e-4, 10), n=st.integers(1, 300), link=links,
       cap=st.sampled_from([0, 1, 25, 100]), overlap=st.booleans(), backward_fraction=st.floats(0.05, 1))
def test_ddp_step_time_plays_out_the_buckets(sizes, compute, n, link, cap, overlap, backward_fraction):
    est = ddp_step_time(sizes, compute, n, link, bucket_cap_mb=cap, first_bucket_mb=1, overlap=overlap,
                        backward_fraction=backward_fraction)
    step, comm = reference_step(sizes, compute, n, link, cap, 1, overlap, backward_fraction)
    assert est.step_s == pytest.approx(step, rel=1e-9) and est.comm_s == pytest.approx(comm, rel=1e-9, abs=1e-15)
    assert est.compute_s == compute and est.exposed_comm_s == pytest.approx(est.step_s - compute, abs=1e-12)
    assert 0 < est.efficiency <= 1 and est.efficiency == pytest.approx(compute / est.step_s)
    assert 0 <= est.exposed_comm_s <= est.comm_s + 1e-12


@FAST
@given(sizes=grad_lists, compute=st.floats(1e-4, 10), n=st.integers(2, 300), link=links,
       faster=st.floats(1, 100), cap=st.sampled_from([0, 1, 25, 100]), overlap=st.booleans())
def test_the_model_never_rewards_a_worse_setting(sizes, compute, n, link, faster, cap, overlap):
    kw = dict(bucket_cap_mb=cap)
    base = ddp_step_time(sizes, compute, n, link, overlap=overlap, **kw)
    wider = Link("wider", link.alpha_s, link.bandwidth_Bps * faster, "test")
    quicker = Link("quicker", link.alpha_s / faster, link.bandwidth_Bps, "test")
    assert ddp_step_time(sizes, compute, n, wider, overlap=overlap, **kw).step_s <= base.step_s
    assert ddp_step_time(sizes, compute, n, quicker, overlap=overlap, **kw).step_s <= base.step_s
    assert ddp_step_time(sizes, compute, n, link, overlap=True, **kw).step_s <= \
        ddp_step_time(sizes, compute, n, link, overlap=False, **kw).step_s
    assert ddp_step_time(sizes, compute, n + 1, link, overlap=overlap, **kw).efficiency <= base.efficiency
    one = ddp_step_time(sizes, compute, 1, link, overlap=overlap, **kw)
    assert (one.comm_s, one.exposed_comm_s, one.step_s, one.efficiency) == (0.0, 0.0, compute, 1.0)


def test_ddp_step_time_rejects_bad_inputs():
    link = LINKS["100 Gb/s network"]
    for args, kw in [(([4], 0.1, 0, link), {}), (([4], 0.0, 2, link), {}), (([4], -1.0, 2, link), {}),
                     (([4], 0.1, 2, "link"), {}), (([-4], 0.1, 2, link), {}), (([4], 0.1, 2, link),
                     {"backward_fraction": 0}), (([4], 0.1, 2, link), {"backward_fraction": 1.5}),
                     (([4], 0.1, 2, link), {"bucket_cap_mb": -1}), (([4], float("inf"), 2, link), {})]:
        with pytest.raises(ValueError):
            ddp_step_time(*args, **kw)


@FAST
@given(sizes=grad_lists, compute=st.floats(1e-3, 1), n=st.integers(1, 64), link=links, overlap=st.booleans())
def test_bucket_schedule_draws_the_same_step(sizes, compute, n, link, overlap):
    est = ddp_step_time(sizes, compute, n, link, overlap=overlap)
    spans = bucket_schedule(sizes, compute, n, link, overlap=overlap)
    work = [s for s in spans if s.lane == "compute"]
    comm = [s for s in spans if s.lane == "all-reduce"]
    assert work[0].start == 0 and work[-1].end == pytest.approx(compute * 1e3)
    assert all(a.end == pytest.approx(b.start) for a, b in zip(work, work[1:])), "compute runs without a gap"
    assert len(comm) == (len(bucket_sizes(sizes)) if n > 1 else 0)
    assert all(a.end <= b.start + 1e-9 for a, b in zip(comm, comm[1:])), "one all-reduce at a time, in order"
    assert max(s.end for s in spans) == pytest.approx(est.step_s * 1e3)
    assert sum(s.duration for s in comm) == pytest.approx(est.comm_s * 1e3, abs=1e-9)
    if not overlap:
        assert all(s.start >= compute * 1e3 - 1e-9 for s in comm)
    seconds = bucket_schedule(sizes, compute, n, link, overlap=overlap, unit="s")
    assert max(s.end for s in seconds) == pytest.approx(est.step_s)


def test_scaling_curve_is_one_estimate_per_gpu_count():
    grads = MODELS["ResNet-50 (25.6M)"]
    curve = scaling_curve(grads, 0.1, LINKS["100 Gb/s network"], gpus=(1, 2, 8, 64), overlap=False)
    assert [n for n, _ in curve] == [1, 2, 8, 64]
    assert all(isinstance(e, StepEstimate) for _, e in curve)
    assert curve[0][1].efficiency == 1.0
    assert [e for _, e in curve][2] == ddp_step_time(grads, 0.1, 8, LINKS["100 Gb/s network"], overlap=False)
    efficiencies = [e.efficiency for _, e in curve]
    assert efficiencies == sorted(efficiencies, reverse=True)


# --------------------------------------------------------------------------------------------------- explorer


def test_the_explorer_builds_redraws_and_says_what_is_measured(caplog, capsys):
    import matplotlib.pyplot as plt

    fitted = Link("fitted here (gloo, 2 ranks)", 80e-6, 1.5e9, "fitted to your lesson-04 sweep")
    try:
        with caplog.at_level(logging.WARNING):
            widget = ddp_explorer(measured={1: 1.0, 2: 0.62}, fitted=fitted)
            controls = {c.description: c for c in widget.children if hasattr(c, "description")}
            assert isinstance(widget.result, StepEstimate)
            assert list(controls["link"].options)[0] == fitted.name
            # the browser starts the compute slider at the 34.5 ms measured, not at the nearest step of a plain
            # FloatLogSlider from 0.1 ms (35.5 ms): course_lib.sliders
            assert browser_start(controls["compute per step (ms)"]) == pytest.approx(34.5, rel=1e-12)
            controls["GPUs"].value = 64
            assert widget.result == ddp_step_time(MODELS["ResNet-50 (25.6M)"], 0.0345, 64,
                                                  LINKS["NVLink, 8×H100 node"])
            controls["link"].value = fitted.name
            controls["overlap all-reduce with backward"].value = False
            assert widget.result == ddp_step_time(MODELS["ResNet-50 (25.6M)"], 0.0345, 64, fitted, overlap=False)
            labels = [t.get_text() for t in plt.gcf().axes[0].get_legend().get_texts()]
            assert "measured on this machine (CPU, gloo)" in labels
        assert not [r for r in caplog.records if "interact" in r.getMessage()], "a callback raised"
        assert all(len(line) <= 100 for line in capsys.readouterr().out.splitlines())
        custom = ddp_explorer(model_params={"my MLP": [4096, 400_000], "a 7B count": 7_000_000_000}, gpus=2)
        assert isinstance(custom.result, StepEstimate)
        for bad in [dict(measured={0: 0.5}), dict(measured={2: float("nan")}), dict(model_params={}),
                    dict(fitted="NVLink"), dict(model_params={"x": [-4]})]:
            with pytest.raises(ValueError):
                ddp_explorer(**bad)
    finally:
        plt.close("all")


def test_the_pictures_are_imported_from_ddp_on_first_use():
    from course_lib.parallel import ddp, ddp_pictures

    assert ddp.ddp_explorer is ddp_pictures.ddp_explorer and ddp.draw_ddp_step is ddp_pictures.draw_ddp_step
    assert set(ddp.__all__) <= set(vars(ddp)) | {"draw_ddp_step", "ddp_explorer"}
    with pytest.raises(AttributeError):
        ddp.no_such_name

