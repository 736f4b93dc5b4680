"""course_lib.parallel.sharding: notebook 08's ZeRO calculator against the paper's figures and hand arithmetic, its
communication count, its pictures, and per_rank_state_bytes in 2 gloo ranks (DDP against FSDP2)."""

from __future__ import annotations

import matplotlib
import pytest
import torch
from matplotlib.figure import Figure
from torch import nn

from course_lib.dist import launch
from course_lib.parallel.sharding import (COMM_SOURCE, STAGE_NAMES, ZERO_PAPER_HEADER, ZERO_SOURCE, comm_volume,
                                          draw_zero_stages, per_rank_state_bytes, plot_zero_memory, zero_memory,
                                          zero_paper_figure)

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
    numel = sum(p.numel() for p in mlp().parameters())
    return {"ddp": ddp, "fsdp": one_step(fsdp), "numel": numel,
            "dtensor": type(next(fsdp.parameters())).__name__}


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
