"""course_lib.parallel.sharding: notebook 08's ZeRO calculator against the paper's figures and hand arithmetic, its
communication count (the formula, the ring count of logged collectives, the bytes on the wire), its pictures, and
per_rank_state_bytes and largest_unshard_bytes in 2 gloo ranks (DDP against FSDP2)."""

from __future__ import annotations

import matplotlib
import pytest
import torch
from matplotlib.figure import Figure
from torch import nn

from course_lib.dist import launch
from course_lib.parallel.sharding import (COMM_SOURCE, STAGE_NAMES, ZERO_PAPER_HEADER, ZERO_SOURCE, bytes_written,
                                          comm_volume, draw_zero_stages, largest_unshard_bytes,
                                          min_gpus_for_model_state, per_rank_state_bytes, plot_zero_memory,
                                          ring_bytes_sent, zero_memory, zero_paper_figure)

matplotlib.use("Agg")


# ------------------------------------------------------------------------------------------------ the calculator


def test_zero_memory_reproduces_figure_1_of_the_paper():
    # Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B, N_d = 64, K = 12 -> 120, 31.4, 16.6 and 1.9 GB per GPU
    memory = zero_memory(7_500_000_000, 64)
    assert list(memory) == [0, 1, 2, 3]
    assert [round(memory[s]["total"] / 1e9, 1) for s in memory] == [120.0, 31.4, 16.6, 1.9]
    assert memory[0]["total"] == 16 * 7_500_000_000  # 2 + 2 + K bytes per parameter
    assert "1910.02054" in ZERO_SOURCE


def test_zero_memory_by_hand():
    psi, n = 1000, 4
    memory = zero_memory(psi, n)
    expected = {0: (2000, 2000, 12000), 1: (2000, 2000, 3000), 2: (2000, 500, 3000), 3: (500, 500, 3000)}
    for stage, (params, grads, optimizer) in expected.items():
        row = memory[stage]
        assert (row["params"], row["grads"], row["optimizer"]) == (params, grads, optimizer), stage
        assert row["total"] == params + grads + optimizer and row["name"] == STAGE_NAMES[stage]
    assert [memory[s]["total"] for s in memory] == [16000, 7000, 5500, 4000]
    # fp32 parameters and gradients with plain Adam (two fp32 moments): 4 + 4 + 8 bytes per parameter
    fp32 = zero_memory(1000, 2, stages=(3, 0), k=8, param_bytes=4, grad_bytes=4)
    assert list(fp32) == [3, 0] and fp32[0]["total"] == 16000 and fp32[3]["total"] == 8000
    assert zero_memory(10, 1, stages=[2])[2]["total"] == zero_memory(10, 1, stages=[0])[0]["total"] == 160
    assert zero_memory(0, 8)[3]["total"] == 0
    assert zero_memory(7, 3, stages=[3])[3]["params"] == pytest.approx(14 / 3)  # the paper's exact division


def test_zero_memory_rejects_bad_inputs():
    for args, kwargs in [((-1, 4), {}), ((10, 0), {}), ((10, 4), {"stages": [4]}), ((10, 4), {"stages": [-1]}),
                         ((10, 4), {"k": -1}), ((10, 4), {"param_bytes": float("nan")})]:
        with pytest.raises(ValueError):
            zero_memory(*args, **kwargs)
    for args, kwargs in [((1.5, 4), {}), ((10, True), {}), ((10, 4), {"stages": "0123"}), ((10, 4), {"stages": 3})]:
        with pytest.raises(TypeError):
            zero_memory(*args, **kwargs)
    for args, kwargs in [((float("nan"), 4), {}), ((10, float("inf")), {}), ((10, 2.5), {})]:
        with pytest.raises(TypeError, match="whole number"):
            zero_memory(*args, **kwargs)
    # counts accept integral floats, as the ZeRO paper types them (Ψ = 7.5e9): the course's rule for counts
    assert zero_memory(7.5e9, 64.0) == zero_memory(7_500_000_000, 64)


def test_zero_paper_figure_is_a_table_from_zero_memory_with_its_source():
    rows, sentence = zero_paper_figure()
    assert len(ZERO_PAPER_HEADER) == len(rows[0]) and len(rows) == 4
    assert [row[0] for row in rows] == list(STAGE_NAMES.values())
    assert [row[2] for row in rows] == [row[3] for row in rows] == [120, 31.4, 16.6, 1.9]
    assert "arXiv:1910.02054" in sentence and "7.5B" in sentence and "64" in sentence


def test_plot_zero_memory_draws_a_bar_per_size_and_stage_and_the_gpu_line():
    sizes = {"1.3B": 1_300_000_000, "7B": 7_000_000_000, "70B": 70_000_000_000}
    fig = plot_zero_memory(sizes, 8, gpu_memory_gb=80)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    bars = [p for p in ax.patches if p.get_height() > 0]
    assert len(bars) == 12
    expected = sorted(zero_memory(psi, 8)[s]["total"] / 1e9 for psi in sizes.values() for s in range(4))
    assert sorted(b.get_height() for b in bars) == pytest.approx(expected)
    assert any(list(line.get_ydata()) == [80, 80] for line in ax.get_lines())
    assert ax.get_yscale() == "log" and ax.get_xlabel() and ax.get_ylabel()
    for bad in [({}, 8), (sizes, 0), ("7B", 8)]:
        with pytest.raises((ValueError, TypeError)):
            plot_zero_memory(*bad)
    with pytest.raises(ValueError):
        plot_zero_memory(sizes, 8, gpu_memory_gb=0)


# ---------------------------------------------------------------------------------------------- communication


def test_comm_volume_by_hand():
    psi, n = 1_000_000, 4
    share = 2 * psi * 3 / 4  # one ring reduce-scatter or all-gather of the fp16 model: V(N-1)/N
    ddp = comm_volume(psi, n, 0)
    assert ddp["bytes_per_rank"] == 2 * share and len(ddp["collectives"]) == 1
    for stage in (1, 2):
        volume = comm_volume(psi, n, stage)
        assert volume["bytes_per_rank"] == 2 * share and volume["ratio_to_ddp"] == 1.0
        assert [name.split()[0] for name, _ in volume["collectives"]] == ["reduce-scatter", "all-gather"]
    three = comm_volume(psi, n, 3)
    assert three["bytes_per_rank"] == 3 * share and three["ratio_to_ddp"] == 1.5  # the paper's "up to 1.5x"
    assert sum(sent for _, sent in three["collectives"]) == three["bytes_per_rank"]
    assert comm_volume(psi, 8, 0, bytes_per_param=4)["bytes_per_rank"] == 2 * 4 * psi * 7 / 8
    assert comm_volume(psi, 1, 3)["bytes_per_rank"] == 0  # one rank sends nothing
    assert three["source"] == COMM_SOURCE and "1910.02054" in COMM_SOURCE
    for bad in [(psi, n, 4), (psi, 0, 1), (-1, n, 1)]:
        with pytest.raises(ValueError):
            comm_volume(*bad)
    with pytest.raises(TypeError):  # a stage is a label, not a count: 1.0 is refused (a count such as Ψ takes 7.5e9)
        comm_volume(psi, n, 1.0)


def test_comm_volume_with_bf16_gathers_and_fp32_reductions():
    # FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): gathers of 2 bytes, reductions of 4
    psi, n = 1_000, 2
    mixed = comm_volume(psi, n, 3, bytes_per_param=2, reduce_bytes_per_param=4)
    assert [sent for _, sent in mixed["collectives"]] == [1000, 1000, 2000]  # 2Ψ(N-1)/N twice, then 4Ψ(N-1)/N
    assert mixed["bytes_per_rank"] == 4000 and mixed["ratio_to_ddp"] == 1.0  # DDP all-reduces fp32: 2 × 2000
    assert comm_volume(psi, n, 0, reduce_bytes_per_param=4)["bytes_per_rank"] == 4000
    assert comm_volume(psi, n, 2, bytes_per_param=4)["bytes_per_rank"] == comm_volume(psi, n, 0, 4)["bytes_per_rank"]
    with pytest.raises(ValueError):
        comm_volume(psi, n, 3, reduce_bytes_per_param=-1)


def test_min_gpus_for_model_state_by_hand():
    # 16 bytes per parameter at stage 3: 70B in 80 GB needs 16 × 70e9 / N <= 80e9, N >= 14 (13 gives 86.2 GB)
    assert min_gpus_for_model_state(70_000_000_000, 80e9) == 14
    assert zero_memory(70_000_000_000, 13, stages=[3])[3]["total"] > 80e9
    assert min_gpus_for_model_state(70_000_000_000, 80e9, stage=2) is None  # 2Ψ of bf16 parameters on every GPU
    assert min_gpus_for_model_state(70_000_000_000, 80e9, stage=0) is None
    assert min_gpus_for_model_state(1_000_000_000, 80e9, stage=0) == 1      # 16 GB fits on one
    assert min_gpus_for_model_state(7_500_000_000, 80e9, stage=1) == 2      # 30 GB + 90 GB / N <= 80 GB
    assert min_gpus_for_model_state(0, 1.0) == 1
    for bad in [(10, 0), (10, -5.0), (10, float("nan")), (10, 1e9, 4)]:
        with pytest.raises(ValueError):
            min_gpus_for_model_state(*bad)


def test_ring_bytes_sent_by_hand():
    log = [{"op": "all_reduce", "bytes": 400}, {"op": "all_gather", "bytes": 100},
           {"op": "reduce_scatter", "bytes": 400}, {"op": "broadcast", "bytes": 400}, {"op": "all_gather", "bytes": 100}]
    sent = ring_bytes_sent(log, 4)
    assert sent["all_reduce"] == 600 and sent["all_gather"] == 600 and sent["reduce_scatter"] == 300
    assert sent["broadcast"] == 300 and sent["total"] == 1800
    assert sent["count"] == {"all_reduce": 1, "all_gather": 2, "reduce_scatter": 1, "broadcast": 1}
    assert ring_bytes_sent(log, 1)["total"] == 0 and ring_bytes_sent([], 3)["total"] == 0
    for bad in [[{"op": "send", "bytes": 4}], [{"bytes": 4}], ["all_reduce"], [{"op": "all_reduce", "bytes": -1}]]:
        with pytest.raises(ValueError):
            ring_bytes_sent(bad, 2)


def _traffic_of_collectives(rank, world_size):
    import torch.distributed as dist

    from course_lib.parallel.tensor_parallel import logged_collectives

    # the tensor forms' names of torch 2.14 (the older ones warn there), or of 2.11–2.13
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    out = {}
    for op, call in [("all_reduce", lambda: dist.all_reduce(torch.ones(65536))),
                     ("all_gather", lambda: gather(torch.empty(world_size * 16384), torch.ones(16384))),
                     ("reduce_scatter", lambda: scatter(torch.empty(16384), torch.ones(world_size * 16384)))]:
        dist.barrier()
        before = bytes_written()
        with logged_collectives() as log:
            call()
        out[op] = (ring_bytes_sent(log, world_size)["total"], bytes_written() - before)
    return out


@pytest.mark.skipif(bytes_written() is None, reason="/proc/self/io is Linux's")
def test_bytes_written_sees_gloo_traffic_and_gloo_reduce_scatters_by_all_reduce():
    for rank in launch(_traffic_of_collectives, 2, backend="gloo", quiet=True, timeout=120):
        ring, wire = rank["all_reduce"]
        assert ring == 65536 * 4 and ring <= wire <= ring + 4096          # the ring's bytes, plus gloo's headers
        ring, wire = rank["all_gather"]
        assert ring == 16384 * 4 and ring <= wire <= ring + 4096
        # ProcessGroupGloo's reduce-scatter all-reduces the whole tensor and keeps its chunk: twice the ring's count
        ring, wire = rank["reduce_scatter"]
        assert ring == 16384 * 4 and 2 * ring <= wire <= 2 * ring + 4096


def test_draw_zero_stages_shows_full_states_and_one_shard_per_rank():
    n = 4
    fig = draw_zero_stages(n)
    assert isinstance(fig, Figure)
    panels = [ax for ax in fig.axes if ax.patches]
    assert len(panels) == 4
    sharded_states = {0: 0, 1: 1, 2: 2, 3: 3}
    for stage, ax in enumerate(panels):
        filled = [p for p in ax.patches if p.get_facecolor()[:3] != (1.0, 1.0, 1.0)]
        slices = [p for p in filled if p.get_width() == pytest.approx(1 / n)]
        assert len(filled) == 3 * n and len(slices) == sharded_states[stage] * n, stage
        assert STAGE_NAMES[stage] in ax.get_title(loc="left")
    assert "4Ψ bytes per rank" in panels[3].get_title(loc="left") and "16Ψ" in panels[0].get_title(loc="left")
    with pytest.raises(ValueError):
        draw_zero_stages(0)


# ------------------------------------------------------------------------------------- measured, in the ranks


def test_per_rank_state_bytes_of_a_plain_model_and_adam():
    torch.manual_seed(0)
    shared = nn.Linear(8, 8)
    model = nn.Sequential(shared, nn.ReLU(), shared, nn.Linear(8, 2))  # a tied layer counts once
    numel = 8 * 8 + 8 + 8 * 2 + 2
    assert per_rank_state_bytes(model) == {"params": 4 * numel, "grads": 0, "optimizer": 0, "total": 4 * numel}
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 8)).sum().backward()
    optimizer.step()
    counts = per_rank_state_bytes(model, optimizer)
    steps = 4 * len(list(model.parameters()))  # Adam's step: a one-element float32 tensor per parameter
    assert counts == {"params": 4 * numel, "grads": 4 * numel, "optimizer": 8 * numel + steps,
                      "total": 16 * numel + steps}
    model[3].weight.grad = None
    assert per_rank_state_bytes(model, optimizer)["grads"] == 4 * (numel - 16)


def _ddp_and_fsdp_states(rank, world_size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(3)), nn.Linear(64, 8))

    def one_step(model):
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)  # after wrapping: the sharded parameters
        generator = torch.Generator().manual_seed(rank)
        model(torch.randn(4, 64, generator=generator)).pow(2).mean().backward()
        optimizer.step()
        return per_rank_state_bytes(model, optimizer)

    ddp = one_step(DDP(mlp()))
    fsdp = mlp()
    for block in fsdp[:-1]:
        fully_shard(block, mesh=init_device_mesh("cpu", (world_size,)))
    fully_shard(fsdp, mesh=init_device_mesh("cpu", (world_size,)))
    root_only = mlp()
    fully_shard(root_only, mesh=init_device_mesh("cpu", (world_size,)))
    numel = sum(p.numel() for p in mlp().parameters())
    return {"ddp": ddp, "fsdp": one_step(fsdp), "numel": numel,
            "dtensor": type(next(fsdp.parameters())).__name__,
            "gathers": (largest_unshard_bytes(fsdp), largest_unshard_bytes(root_only), largest_unshard_bytes(mlp()))}


def test_fsdp2_ranks_hold_half_of_what_ddp_ranks_hold():
    results = launch(_ddp_and_fsdp_states, 2, backend="gloo", quiet=True, timeout=120)
    numel = results[0]["numel"]
    for result in results:
        ddp, fsdp = result["ddp"], result["fsdp"]
        assert result["dtensor"] == "DTensor"
        assert ddp["params"] == ddp["grads"] == 4 * numel  # every rank holds the whole fp32 model
        # every dimension 0 here is even (64 and 8), so each rank's shard is exactly half of each tensor
        assert fsdp["params"] == fsdp["grads"] == ddp["params"] // 2
        assert fsdp["optimizer"] == pytest.approx(ddp["optimizer"] / 2, rel=0.01)  # Adam's steps are not sharded
        predicted = zero_memory(numel, 2, stages=(0, 3), k=8, param_bytes=4, grad_bytes=4)
        assert fsdp["params"] + fsdp["grads"] == predicted[3]["params"] + predicted[3]["grads"]
        assert ddp["params"] + ddp["grads"] == predicted[0]["params"] + predicted[0]["grads"]
        assert fsdp["total"] == pytest.approx(predicted[3]["total"], rel=0.01)
        assert ddp["total"] == pytest.approx(predicted[0]["total"], rel=0.01)
        # per block: one Linear(64, 64) at a time (the root's own group, Linear(64, 8), is smaller); root only:
        # the whole model at once; no fully_shard: nothing
        assert result["gathers"] == ((64 * 64 + 64) * 4, 4 * numel, 0)


def _fsdp2_traffic(rank, world_size):
    import torch.nn.functional as F
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from course_lib.parallel.tensor_parallel import logged_collectives

    counted = {}
    for name, reshard, policy in [("zero3", True, None), ("kept", False, None),
                                  ("bf16", True, MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                      reduce_dtype=torch.float32))]:
        torch.manual_seed(0)
        model = nn.Sequential(*(nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(3)))
        extra = {"mp_policy": policy} if policy else {}
        for block in model:
            fully_shard(block, reshard_after_forward=reshard, **extra)
        fully_shard(model, **extra)
        x = torch.randn(4, 32)
        F.mse_loss(model(x).float(), torch.zeros(4, 32)).backward()
        with logged_collectives() as log:
            F.mse_loss(model(x).float(), torch.zeros(4, 32)).backward()
        counted[name] = ring_bytes_sent(log, world_size)
    return counted


def test_fsdp2_sends_what_comm_volume_predicts():
    # Notebook 08's claim: FSDP2's collectives, counted as a ring sends them, are the ZeRO paper's volume to the
    # byte when every dim 0 divides by the ranks (32 by 2: no padding). reshard_after_forward=False: stage 2's.
    numel = 3 * (32 * 32 + 32)
    for counted in launch(_fsdp2_traffic, 2, backend="gloo", quiet=True, timeout=120):
        assert counted["zero3"]["count"]["all_gather"] == 6 and counted["zero3"]["count"]["reduce_scatter"] == 3
        assert counted["zero3"]["total"] == comm_volume(numel, 2, 3, bytes_per_param=4)["bytes_per_rank"]
        assert counted["kept"]["count"]["all_gather"] == 3
        assert counted["kept"]["total"] == comm_volume(numel, 2, 2, bytes_per_param=4)["bytes_per_rank"]
        assert counted["bf16"]["total"] == comm_volume(numel, 2, 3, bytes_per_param=2,
                                                       reduce_bytes_per_param=4)["bytes_per_rank"]
