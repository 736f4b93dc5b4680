"""course_lib.parallel.tensor_parallel: notebook 07's communication count, by hand and against what 2 gloo ranks sent.

References: plain arithmetic for tp_comm_volume; for logged_collectives, the collectives a rank is known to issue
(dist.* calls written out in the test, a Megatron-LM MLP block written by hand with dist.all_reduce, and torch's
own ColwiseParallel + RowwiseParallel), and an unsplit MLP for the block's output and gradients.
"""

from __future__ import annotations

import pytest
import torch

from course_lib.dist import launch
from course_lib.parallel.tensor_parallel import MEGATRON_SOURCE, logged_collectives, tp_comm_volume


def test_tp_comm_volume_by_hand():
    # batch 8, sequence 1024, hidden 4096, bf16: one all-reduce moves 8·1024·4096·2 bytes = 64 MiB
    volume = tp_comm_volume(8, 1024, 4096, tp=4)
    assert volume["activation_bytes"] == 67_108_864
    assert volume["forward_all_reduces"] == volume["backward_all_reduces"] == 1
    assert volume["all_reduced_bytes"] == 134_217_728  # forward and backward
    assert volume["ring_bytes_per_rank"] == 201_326_592  # 2·3/4 of that, each rank's share of the ring
    assert volume["transformer_layer_all_reduced_bytes"] == 268_435_456  # attention's two as well
    assert "1909.08053" in volume["source"] and volume["source"] == MEGATRON_SOURCE
    fp32 = tp_comm_volume(2, 3, 5, tp=3, dtype_bytes=4)
    assert fp32["activation_bytes"] == 120 and fp32["ring_bytes_per_rank"] == pytest.approx(2 * 2 / 3 * 240)
    alone = tp_comm_volume(8, 1024, 4096, tp=1)
    assert alone["forward_all_reduces"] == alone["all_reduced_bytes"] == alone["ring_bytes_per_rank"] == 0
    for bad in [(0, 1, 1, 2), (1, 1, 1, 0), (1, -3, 1, 2)]:
        with pytest.raises(ValueError):
            tp_comm_volume(*bad)
    for bad in [(1.5, 1, 1, 2), (1, 1, "8", 2), (True, 1, 1, 2)]:
        with pytest.raises(TypeError):
            tp_comm_volume(*bad)
    with pytest.raises(TypeError):
        tp_comm_volume(1, 1, 1, 2, dtype_bytes=torch.bfloat16)


def test_logged_collectives_needs_a_rank():
    with pytest.raises(RuntimeError, match="inside a rank"):
        with logged_collectives():
            pass


def _rank(rank, world_size, batch, seq, hidden):
    import warnings

    import torch
    import torch.distributed as dist
    from torch import nn

    from course_lib.parallel.tensor_parallel import logged_collectives

    warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor's new name in 2.14
    found = {}
    t = torch.ones(6)
    with logged_collectives() as plain:
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        dist.all_gather([torch.empty(6) for _ in range(world_size)], t)
        dist.broadcast(t.double(), src=0)
        dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * world_size))
        others = dist.new_group(list(range(world_size)))
        dist.all_reduce(t, group=others)  # not the default group: not logged
    found["plain"] = plain
    with logged_collectives(all_groups=True) as every:
        dist.all_reduce(t, group=others)
    found["every"] = every

    # A Megatron-LM MLP block by hand: f (identity forward, all-reduce backward), column-parallel Linear, GeLU,
    # row-parallel Linear, g (all-reduce forward, identity backward).
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    class G(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            dist.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad

    torch.manual_seed(0)
    full = nn.Sequential(nn.Linear(hidden, 4 * hidden, bias=False), nn.GELU(),
                         nn.Linear(4 * hidden, hidden, bias=False))
    share = 4 * hidden // world_size
    w1 = full[0].weight.detach()[rank * share:(rank + 1) * share].clone().requires_grad_()
    w2 = full[2].weight.detach()[:, rank * share:(rank + 1) * share].clone().requires_grad_()
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(1))
    mine = x.clone().requires_grad_()
    with logged_collectives() as forward:
        out = G.apply(nn.functional.gelu(F.apply(mine) @ w1.T) @ w2.T)
    with logged_collectives() as backward:
        out.pow(2).sum().backward()
    reference = x.clone().requires_grad_()
    expected = full(reference)
    expected.pow(2).sum().backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(mine.grad, reference.grad)
    found["by_hand"] = (forward, backward)

    # torch's own: parallelize_module with ColwiseParallel and RowwiseParallel (DTensor, functional collectives).
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world_size,))
    parallelize_module(full, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    theirs = x.clone().requires_grad_()
    with logged_collectives() as forward:
        out = full(theirs)
    with logged_collectives() as backward:
        out.pow(2).sum().backward()
    torch.testing.assert_close(theirs.grad, reference.grad)
    found["dtensor"] = (forward, backward)
    return found


def test_logged_collectives_sees_what_two_ranks_send_and_it_is_megatron_s_count():
    batch, seq, hidden = 2, 3, 8
    results = launch(_rank, 2, batch, seq, hidden, quiet=True, timeout=120)
    volume = tp_comm_volume(batch, seq, hidden, tp=2, dtype_bytes=4)
    for rank, found in enumerate(results):
        assert found["plain"] == [
            {"op": "all_reduce", "numel": 6, "dtype": "torch.float32", "bytes": 24, "group": "0"},
            {"op": "all_reduce", "numel": 6, "dtype": "torch.float32", "bytes": 24, "group": "0"},
            {"op": "all_gather", "numel": 6, "dtype": "torch.float32", "bytes": 24, "group": "0"},
            {"op": "broadcast", "numel": 6, "dtype": "torch.float64", "bytes": 48, "group": "0"},
            {"op": "reduce_scatter", "numel": 6, "dtype": "torch.float32", "bytes": 24, "group": "0"},
        ], f"rank {rank}"
        assert len(found["every"]) == 1 and found["every"][0]["group"] != "0"
        for how in ("by_hand", "dtensor"):
            forward, backward = found[how]
            for log, count in ((forward, volume["forward_all_reduces"]), (backward, volume["backward_all_reduces"])):
                assert [e["op"] for e in log] == ["all_reduce"] * count, f"rank {rank}, {how}: {log}"
                assert sum(e["bytes"] for e in log) == count * volume["activation_bytes"]
            assert sum(e["bytes"] for e in forward + backward) == volume["all_reduced_bytes"]
