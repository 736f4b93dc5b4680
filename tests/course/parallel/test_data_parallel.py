"""course_lib.parallel.data_parallel: the by-hand DataParallel that notebook 03 measures and lesson 05 compares with DDP."""

from __future__ import annotations

import copy
import threading
import time

import matplotlib
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.parallel.data_parallel import (DataParallelByHand, PhaseTimer, chunk_sizes, parallel_apply,
                                               replica_devices, step_picture)

matplotlib.use("Agg")


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


@pytest.mark.parametrize("batch, replicas", [(10, 4), (9, 4), (8, 2), (5, 1)])
def test_by_hand_step_sums_the_replicas_gradients_into_the_model(batch, replicas):
    model = _model().eval()  # eval: BatchNorm computes the same function on every chunk
    reference = copy.deepcopy(model)
    x, y = torch.randn(batch, 6), torch.randint(0, 3, (batch,))
    F.cross_entropy(reference(x), y).backward()
    timer = PhaseTimer()
    dp = DataParallelByHand(model, ["cpu"] * replicas, timer)
    loss = F.cross_entropy(dp(x), y)
    dp.backward(loss)
    dp.reduce_gradients()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert {"scatter", "replicate", "forward", "gather", "backward", "reduce"} <= set(timer.seconds)
    assert list(dp.state_dict())[0].startswith("module."), "state_dict keys carry DataParallel's prefix"


def test_by_hand_running_statistics_come_from_the_first_chunk_and_grads_replace_old_ones():
    model, chunk0_only = _model(), _model()
    x = torch.randn(12, 6) + torch.linspace(-3, 3, 12)[:, None]
    for p in model.parameters():
        p.grad = torch.full_like(p, 100.0)  # stale gradients must be replaced, not added to
    dp = DataParallelByHand(model, ["cpu"] * 3)
    dp.backward(F.cross_entropy(dp(x), torch.zeros(12, dtype=torch.long)))
    dp.reduce_gradients()
    chunk0_only(x[:4])
    torch.testing.assert_close(model[1].running_mean, chunk0_only[1].running_mean)
    assert int(model[1].num_batches_tracked) == 1
    assert all(p.grad.abs().max() < 100 for p in model.parameters())


def test_parallel_apply_runs_side_by_side_keeps_order_and_carries_thread_settings():
    def slow(delay):
        start = time.perf_counter()
        time.sleep(delay)
        return start, time.perf_counter(), threading.current_thread().name

    (s0, e0, n0), (s1, e1, n1) = parallel_apply([slow, slow], [0.4, 0.1])  # the first finishes last
    assert s1 < e0 and n0 != n1, "both threads ran at once, and the results are in the order of the inputs"

    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.no_grad():
            seen = parallel_apply([lambda: (torch.is_grad_enabled(), torch.get_num_threads())] * 2, [(), ()])
    finally:
        torch.set_num_threads(saved)
    assert seen == [(False, 1), (False, 1)]


def test_parallel_apply_raises_a_replicas_error_in_the_caller():
    with pytest.raises(RuntimeError, match="replica 1 failed: ZeroDivisionError"):
        parallel_apply([lambda a: 1 / a] * 3, [1, 0, 2])
    with pytest.raises(ValueError):
        parallel_apply([abs], [1, 2])


def test_chunk_sizes_are_torch_chunks_and_the_picture_shows_idle_devices():
    for batch, n in [(10, 4), (9, 4), (13, 8), (3, 4), (6, 1)]:
        assert chunk_sizes(batch, n) == [len(c) for c in torch.arange(batch).chunk(n)]
    assert chunk_sizes(0, 4) == []
    ax = step_picture(9, 4)
    assert "1 device(s) idle" in ax.get_title()
    matplotlib.pyplot.close(ax.figure)


def test_replica_devices_says_what_stands_in_for_the_gpus():
    devices, why = replica_devices(2)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert len(devices) == 2
    assert all(d.type == ("cuda" if gpus >= 2 else "cpu") for d in devices)
    assert ("CUDA GPUs" if gpus >= 2 else "on the CPU") in why
    with pytest.raises(ValueError):
        replica_devices(0)


def _matmul_dtype(_):
    a = torch.ones(4, 4)
    return (a @ a).dtype, torch.is_autocast_enabled("cpu")


def test_parallel_apply_carries_the_callers_autocast_into_the_threads():
    """Lesson 06's autocast: under torch.autocast in the caller, the replicas' matmuls run in its dtype, not fp32."""
    for dtype in [torch.bfloat16, torch.float16]:
        with torch.autocast("cpu", dtype=dtype):
            assert parallel_apply([_matmul_dtype] * 3, [0, 1, 2]) == [(dtype, True)] * 3
            with torch.autocast("cpu", enabled=False):  # switched off again inside: off in the threads too
                assert parallel_apply([_matmul_dtype] * 2, [0, 1]) == [(torch.float32, False)] * 2
    assert parallel_apply([_matmul_dtype] * 2, [0, 1]) == [(torch.float32, False)] * 2  # nothing leaks out
    model = nn.Linear(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dp = DataParallelByHand(model, ["cpu"] * 2)
        assert dp(torch.randn(6, 4)).dtype == torch.bfloat16, "the by-hand step runs its replicas under autocast"


def test_parallel_apply_checks_its_devices_argument():
    with pytest.raises(ValueError):
        parallel_apply([abs, abs], [1, 2], devices=["cpu"])
    assert parallel_apply([abs, abs], [-1, -2], devices=["cpu", None]) == [1, 2]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the current device and stream")
def test_parallel_apply_carries_the_callers_stream_and_device_on_cuda():
    def where(x):
        return torch.cuda.current_device(), torch.cuda.current_stream(x.device).cuda_stream

    last = torch.cuda.device_count() - 1
    side = torch.cuda.Stream(device=last)
    with torch.cuda.device(last), torch.cuda.stream(side):
        x = torch.ones(2, device=f"cuda:{last}")
        seen = parallel_apply([where] * 2, [x, x])
    assert seen == [(last, side.cuda_stream)] * 2, "each replica runs on its input's device, on the caller's stream"
    default = torch.cuda.current_stream(last).cuda_stream
    assert parallel_apply([where] * 2, [x, x]) == [(last, default)] * 2
