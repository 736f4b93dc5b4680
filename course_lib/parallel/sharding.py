"""Sharded data parallel: ZeRO's memory and communication by formula, and what a rank really holds (notebook 08).

    zero_memory(num_params, dp_degree)      bytes per GPU of parameters, gradients and optimizer state, per ZeRO stage
    plot_zero_memory(model_sizes, dp)       those totals as bars per model size and stage, with the GPU's memory
    zero_paper_figure()                     the ZeRO paper's Figure 1 example (7.5B parameters, 64 GPUs) recomputed
    comm_volume(num_params, dp, stage)      bytes each rank sends per step: DDP's all-reduce, ZeRO-1/2, ZeRO-3
    draw_zero_stages(dp_degree)             what each rank holds at each stage: full tensors or a 1/N shard
    min_gpus_for_model_state(num_params, gpu_bytes, stage)   the fewest GPUs whose memory holds the model state
    per_rank_state_bytes(model, optimizer)  inside a rank: bytes of its parameters, gradients and optimizer state
    largest_unshard_bytes(model)            inside a rank: the biggest group of parameters FSDP2 all-gathers at once
    ring_bytes_sent(collectives, n)         what a rank's logged collectives send in lesson 04's ring algorithms
    bytes_written()                         inside a rank: bytes this process has passed to write calls (Linux)

The first six are models (Rajbhandari et al. 2020, ZeRO, arXiv:1910.02054): they count model states only, not
activations, temporary buffers (FSDP's all-gathered layer, DDP's buckets) or the allocator's fragmentation, which
sharding does not shrink. per_rank_state_bytes and largest_unshard_bytes measure; notebook 08 and
benchmarks/fsdp_memory.py put the two side by side for DDP and FSDP2 ranks. ring_bytes_sent turns what a rank logged (tensor_parallel.logged_collectives) into
the ring's traffic, and bytes_written counts what really left the process (gloo writes to its TCP sockets), so
notebook 08 puts formula, count and wire side by side. Exercise 08's byte count of a model's states is not here.
"""

from __future__ import annotations

import numbers
from typing import Iterable, Mapping

from course_lib.parallel import whole_number
from course_lib.tables import plural

__all__ = ["ZERO_SOURCE", "COMM_SOURCE", "STAGE_NAMES", "ZERO_PAPER_HEADER", "zero_memory", "plot_zero_memory",
           "zero_paper_figure", "comm_volume", "draw_zero_stages", "min_gpus_for_model_state",
           "per_rank_state_bytes", "largest_unshard_bytes", "ring_bytes_sent", "bytes_written"]

ZERO_SOURCE = ("Rajbhandari et al. 2020, 'ZeRO: Memory Optimizations Toward Training Trillion Parameter Models', "
               "arXiv:1910.02054, Figure 1: mixed-precision Adam keeps 2Ψ bytes of fp16 parameters, 2Ψ of fp16 "
               "gradients and KΨ of optimizer state (K = 12: fp32 parameters, momentum and variance); P_os shards the "
               "optimizer state over N_d data-parallel GPUs, P_os+g the gradients too, P_os+g+p the parameters too")

COMM_SOURCE = ("ring collectives as in lesson 04; the stages' collectives from Rajbhandari et al. 2020, ZeRO, "
               "arXiv:1910.02054 §7: P_os and P_os+g send 2Ψ per step like DDP's all-reduce, P_os+g+p 3Ψ "
               "('a maximum of 1.5x communication')")

# ZeRO's stages, with the paper's names for them (Figure 1: P_os, P_os+g, P_os+g+p) and FSDP2's equivalents.
STAGE_NAMES: dict[int, str] = {
    0: "DDP (baseline)",
    1: "ZeRO-1 (P_os)",
    2: "ZeRO-2 (P_os+g)",
    3: "ZeRO-3 (P_os+g+p)",
}

GB = 1e9  # the paper's GB: 10⁹ bytes (120 GB = 16 bytes × 7.5·10⁹)

# Which states stage s shards (the others every rank holds in full).
_SHARDED = {0: (), 1: ("optimizer",), 2: ("optimizer", "grads"), 3: ("optimizer", "grads", "params")}
_STATES = ("params", "grads", "optimizer")
_LABELS = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer state"}



def _bytes_per(x, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not (x >= 0) or x == float("inf"):
        raise ValueError(f"{what} must be a finite number of bytes per parameter, >= 0, not {x!r}")
    return x


def _stage(stage) -> int:
    stage = whole_number(stage, "a ZeRO stage", minimum=0, integral_floats=False)
    if stage not in STAGE_NAMES:
        raise ValueError(f"ZeRO stages are 0 (DDP), 1, 2 and 3, not {stage}")
    return stage


def zero_memory(num_params: int, dp_degree: int, *, stages: Iterable[int] = (0, 1, 2, 3), k: float = 12,
                param_bytes: float = 2, grad_bytes: float = 2) -> dict[int, dict]:
    """Bytes per GPU of the model states at each ZeRO stage, as in the ZeRO paper's Figure 1 (notebook 08).

    num_params: Ψ; dp_degree: N_d, the GPUs the states are sharded over; k: K, optimizer-state bytes per parameter
    (12 for mixed-precision Adam: fp32 parameters, momentum, variance). param_bytes and grad_bytes are 2 (fp16) as
    in the paper; for a plain fp32 run with Adam say param_bytes=4, grad_bytes=4, k=8. A sharded state costs
    bytes·Ψ/N_d per GPU (the paper's exact division: a real shard is rounded up, padded, per tensor).

    Returns {stage: {"name", "params", "grads", "optimizer", "total"}} in bytes per GPU, for each stage asked for.
    Activations and temporary buffers are not counted (ZERO_SOURCE).
    """
    psi = whole_number(num_params, "num_params", minimum=0)
    n = whole_number(dp_degree, "dp_degree")
    per_param = {"params": _bytes_per(param_bytes, "param_bytes"), "grads": _bytes_per(grad_bytes, "grad_bytes"),
                 "optimizer": _bytes_per(k, "k")}
    if isinstance(stages, (str, bytes)) or not isinstance(stages, Iterable):
        raise TypeError(f"stages must be a sequence of ZeRO stages (0 to 3), not {stages!r}")
    result = {}
    for stage in stages:
        stage = _stage(stage)
        row = {"name": STAGE_NAMES[stage]}
        for state in _STATES:
            full = per_param[state] * psi
            row[state] = full / n if state in _SHARDED[stage] else full
        row["total"] = row["params"] + row["grads"] + row["optimizer"]
        result[stage] = row
    return result


def zero_paper_figure() -> tuple[list[list], str]:
    """The ZeRO paper's Figure 1 example (Ψ = 7.5B, N_d = 64, K = 12) recomputed by zero_memory (notebook 08).

    Returns (rows, sentence): rows [stage name, formula, GB per GPU (zero_memory's), GB in the paper], one per stage,
    for tables.print_table with the header ["stage", "bytes per GPU", "GB (zero_memory)", "GB (paper)"]; the
    sentence says where the figures come from.
    """
    psi, n, k = 7_500_000_000, 64, 12
    paper = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}
    formulas = {0: "(2 + 2 + K)Ψ", 1: "2Ψ + 2Ψ + KΨ/N_d", 2: "2Ψ + (2 + K)Ψ/N_d", 3: "(2 + 2 + K)Ψ/N_d"}
    memory = zero_memory(psi, n, k=k)
    rows = [[row["name"], formulas[stage], round(row["total"] / GB, 1), paper[stage]]
            for stage, row in memory.items()]
    sentence = (f"Ψ = 7.5B parameters, N_d = {plural(n, 'GPU')}, K = {k} (mixed-precision Adam), GB = 10⁹ bytes: the example "
                "of Figure 1 in Rajbhandari et al. 2020, ZeRO, arXiv:1910.02054 (120, 31.4, 16.6 and 1.9 GB per GPU), "
                "recomputed here by zero_memory")
    return rows, sentence


ZERO_PAPER_HEADER = ["stage", "bytes per GPU", "GB (zero_memory)", "GB (paper)"]


def _picture(**kw):
    from course_lib.diagrams import Picture

    return Picture(**kw)


# Okabe–Ito hues, one per stage.
_STAGE_COLOURS = {0: "#999999", 1: "#56B4E9", 2: "#0072B2", 3: "#009E73"}


def plot_zero_memory(model_sizes: Mapping[str, int], dp_degree: int, gpu_memory_gb: float = 80, *, k: float = 12):
    """Model-state memory per GPU (GB) at ZeRO stages 0–3, a group of bars per model size, and the GPU's memory as a
    line (notebook 08).

    model_sizes: {"label": number of parameters}, e.g. {"1.3B": 1_300_000_000}. Log scale: the stages differ by
    orders of magnitude. A bar above the line cannot train on that GPU even before activations. Returns a Figure.
    """
    import numpy as np

    if not isinstance(model_sizes, Mapping) or not model_sizes:
        raise ValueError("model_sizes must be a non-empty {label: number of parameters} mapping")
    n = whole_number(dp_degree, "dp_degree")
    if isinstance(gpu_memory_gb, bool) or not isinstance(gpu_memory_gb, numbers.Real) or not gpu_memory_gb > 0:
        raise ValueError(f"gpu_memory_gb must be a number of GB > 0, not {gpu_memory_gb!r}")
    memory = {label: zero_memory(psi, n, k=k) for label, psi in model_sizes.items()}
    fig = _picture(figsize=(1.6 + 1.5 * len(model_sizes), 4.2), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(model_sizes))
    width = 0.8 / len(STAGE_NAMES)
    for i, stage in enumerate(STAGE_NAMES):
        heights = [memory[label][stage]["total"] / GB for label in model_sizes]
        ax.bar(x + (i - 1.5) * width, heights, width, label=STAGE_NAMES[stage], color=_STAGE_COLOURS[stage])
    ax.axhline(gpu_memory_gb, color="#D55E00", linestyle="--", linewidth=1.2,
               label=f"one GPU's memory ({gpu_memory_gb:g} GB)")
    ax.set_yscale("log")
    ax.set_xticks(x, [f"{label}\n({psi / 1e9:.3g}B)" for label, psi in model_sizes.items()])
    ax.set_xlabel("model (parameters)")
    ax.set_ylabel("model states per GPU (GB, log scale)")
    ax.set_title(f"ZeRO stages over {plural(n, 'data-parallel GPU')}, K = {k:g} (activations not counted)", fontsize=10,
                 loc="left")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    ax.grid(axis="y", alpha=0.3, which="both")
    return fig


def comm_volume(num_params: int, dp_degree: int, stage: int, bytes_per_param: float = 2, *,
                reduce_bytes_per_param: float | None = None) -> dict:
    """Bytes each rank sends in one training step at a ZeRO stage, with ring collectives (notebook 08).

    With V = bytes_per_param·Ψ (the fp16 parameters, or their gradients) and N = dp_degree, a ring reduce-scatter or
    all-gather of V sends V(N−1)/N per rank, an all-reduce twice that (lesson 04). DDP (stage 0) all-reduces the
    gradients: 2V(N−1)/N. ZeRO-1 and 2 reduce-scatter the gradients and all-gather the updated parameters: the same
    2V(N−1)/N ("no additional communication", COMM_SOURCE). ZeRO-3 all-gathers the parameters in the forward and
    again in the backward, and reduce-scatters the gradients: 3V(N−1)/N, the paper's "up to 1.5x". One rank sends
    nothing. FSDP2 with reshard_after_forward=False keeps the gathered parameters from forward to backward: one
    all-gather and the reduce-scatter, stage 2's volume.

    reduce_bytes_per_param: bytes per element of what is reduced (the gradients), when it differs from the gathered
    parameters': FSDP2's MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) gathers 2 and
    reduces 4. DDP's baseline (ratio_to_ddp) all-reduces gradients of that size. Default: bytes_per_param.

    Returns {"stage", "name", "collectives": [(collective, bytes sent per rank)], "bytes_per_rank", "ratio_to_ddp",
    "source"}.
    """
    psi = whole_number(num_params, "num_params", minimum=0)
    n = whole_number(dp_degree, "dp_degree")
    stage = _stage(stage)
    gathered = _bytes_per(bytes_per_param, "bytes_per_param") * psi
    reduced = gathered if reduce_bytes_per_param is None else (
        _bytes_per(reduce_bytes_per_param, "reduce_bytes_per_param") * psi)
    gather, reduce = gathered * (n - 1) / n, reduced * (n - 1) / n  # one ring all-gather, one ring reduce-scatter
    collectives = {
        0: [("all-reduce of the gradients", 2 * reduce)],
        1: [("reduce-scatter of the gradients", reduce), ("all-gather of the updated parameters", gather)],
        2: [("reduce-scatter of the gradients", reduce), ("all-gather of the updated parameters", gather)],
        3: [("all-gather of the parameters, forward", gather), ("all-gather of the parameters, backward", gather),
            ("reduce-scatter of the gradients", reduce)],
    }[stage]
    total = sum(sent for _, sent in collectives)
    return {"stage": stage, "name": STAGE_NAMES[stage], "collectives": collectives, "bytes_per_rank": total,
            "ratio_to_ddp": total / (2 * reduce) if reduce else 1.0,
            "source": COMM_SOURCE}


# Bytes a rank sends, per byte of what it logged (its input), in lesson 04's ring algorithms over N ranks.
_RING_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,      # reduce-scatter then all-gather of the whole tensor
    "reduce_scatter": lambda n: (n - 1) / n,      # the whole tensor in, one 1/N chunk out
    "all_gather": lambda n: n - 1,                # its own piece, forwarded to the N − 1 others
    "broadcast": lambda n: (n - 1) / n,           # a pipelined chain: every rank but the last forwards it; the mean
}


def ring_bytes_sent(collectives, world_size: int) -> dict:
    """What a rank's collectives send in lesson 04's ring algorithms, per kind and in all (notebook 08).

    collectives: entries with "op" and "bytes", as course_lib.parallel.tensor_parallel.logged_collectives() records
    them: the rank's input (the tensor all-reduced or broadcast, its own piece of an all-gather, the whole tensor it
    reduce-scatters). A ring all-reduce of B bytes sends 2B(N−1)/N per rank, a reduce-scatter B(N−1)/N, an all-gather
    of a B-byte piece B(N−1), a broadcast B(N−1)/N on average over the ranks (a chain: the last rank sends nothing).
    This is the algorithm's count, not the backend's: gloo's reduce-scatter is an all-reduce (twice the bytes), its
    broadcast goes from the root to each rank; bytes_written() measures what gloo really sent.

    Returns {"all_reduce": bytes, "reduce_scatter": ..., "all_gather": ..., "broadcast": ..., "total": bytes,
    "count": {kind: number of collectives}}.
    """
    n = whole_number(world_size, "world_size")
    sent = {op: 0.0 for op in _RING_FACTOR}
    count = {op: 0 for op in _RING_FACTOR}
    for entry in collectives:
        op = entry.get("op") if isinstance(entry, Mapping) else None
        if op not in _RING_FACTOR:
            raise ValueError(f"ring_bytes_sent counts {sorted(_RING_FACTOR)} (logged_collectives' entries), "
                             f"not {entry!r}")
        sent[op] += _bytes_per(entry.get("bytes"), "a logged collective's bytes") * _RING_FACTOR[op](n)
        count[op] += 1
    return {**sent, "total": sum(sent.values()), "count": count}


def bytes_written() -> int | None:
    """Bytes this process has passed to write calls so far (Linux's /proc/self/io "wchar"), or None elsewhere.

    Inside a gloo rank, the difference across a step is what the rank sent over its TCP sockets (gloo writes with
    writev), headers included, as long as nothing else writes meanwhile (print, logging, files): the traffic on the
    wire, to set beside ring_bytes_sent's count (notebook 08). The kernel counts it per process, all threads together
    (Documentation/filesystems/proc.rst, "/proc/<pid>/io"). None on macOS and Windows, which have no such file.
    """
    try:
        with open("/proc/self/io") as file:
            fields = dict(line.split(": ", 1) for line in file.read().splitlines() if ": " in line)
        return int(fields["wchar"])
    except (OSError, KeyError, ValueError):
        return None


def min_gpus_for_model_state(num_params: int, gpu_bytes: float, stage: int = 3, *, k: float = 12,
                             limit: int = 1 << 20) -> int | None:
    """The fewest data-parallel GPUs of gpu_bytes each whose memory holds the model state at a ZeRO stage (notebook 08).

    By zero_memory's count (mixed-precision Adam, K = 12; activations not counted, so the real number is higher).
    Stages 0–2 keep some state whole on every GPU: when that alone exceeds the GPU, no number of GPUs helps and the
    answer is None. E.g. 70B parameters in 80 GB GPUs at stage 3: 16 × 70e9 / N ≤ 80e9, so N = 14.
    """
    psi = whole_number(num_params, "num_params", minimum=0)
    if isinstance(gpu_bytes, bool) or not isinstance(gpu_bytes, numbers.Real) or not gpu_bytes > 0:
        raise ValueError(f"gpu_bytes must be a number of bytes > 0, not {gpu_bytes!r}")
    stage = _stage(stage)
    fits = lambda n: zero_memory(psi, n, stages=[stage], k=k)[stage]["total"] <= gpu_bytes  # noqa: E731
    if not fits(limit):
        return None
    low, high = 1, limit                         # the total falls as N grows: the smallest N that fits, by bisection
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle + 1, high)
    return low


def draw_zero_stages(dp_degree: int = 4):
    """What each of dp_degree ranks holds at ZeRO stages 0–3: parameters, gradients and optimizer state, each as the
    whole tensor or this rank's 1/N slice of it (notebook 08).

    One panel per stage, one column per rank, one strip per kind of state; a strip filled across is the full state,
    a filled slice is the rank's shard (the rest, outlined, lives on the other ranks). Each panel's title gives its
    bytes per rank in units of Ψ (K = 12). Returns a Figure.
    """
    from matplotlib.patches import Patch, Rectangle

    n = whole_number(dp_degree, "dp_degree")
    if n > 16:
        raise ValueError(f"draw_zero_stages draws up to 16 ranks, not {n}")
    colours = {"params": "#0072B2", "grads": "#E69F00", "optimizer": "#009E73"}
    fig = _picture(figsize=(max(6.0, 1.5 * n + 2.2), 7.2), layout="constrained")
    axes = fig.subplots(len(STAGE_NAMES), 1, sharex=True)
    per_param = {"params": 2, "grads": 2, "optimizer": 12}
    for ax, stage in zip(axes, STAGE_NAMES):
        for rank in range(n):
            x0 = rank * 1.15
            for row, state in enumerate(_STATES):
                y = row
                ax.add_patch(Rectangle((x0, y - 0.35), 1.0, 0.7, facecolor="white", edgecolor="#BBBBBB",
                                       linewidth=0.6))
                if state in _SHARDED[stage]:
                    ax.add_patch(Rectangle((x0 + rank / n, y - 0.35), 1.0 / n, 0.7, facecolor=colours[state]))
                else:
                    ax.add_patch(Rectangle((x0, y - 0.35), 1.0, 0.7, facecolor=colours[state]))
        terms = [f"{per_param[s]}Ψ/{n}" if s in _SHARDED[stage] else f"{per_param[s]}Ψ" for s in _STATES]
        per_rank = zero_memory(1, n, stages=[stage])[stage]["total"]
        ax.set_title(f"{STAGE_NAMES[stage]}: {' + '.join(terms)} = {per_rank:.3g}Ψ bytes per rank", fontsize=9,
                     loc="left")
        ax.set_yticks(range(len(_STATES)), [_LABELS[s] for s in _STATES], fontsize=8)
        ax.set_ylim(len(_STATES) - 0.5, -0.5)
        ax.set_xlim(-0.05, n * 1.15)
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
        ax.tick_params(axis="y", length=0)
    axes[-1].set_xticks([rank * 1.15 + 0.5 for rank in range(n)], [f"rank {rank}" for rank in range(n)])
    axes[-1].set_xlabel(f"data-parallel ranks (N = {n}); a filled slice is the rank's shard, 1/{n} of the state")
    handles = [Patch(facecolor=colours[s], label=f"{_LABELS[s]} ({plural(per_param[s], 'byte')} per parameter)") for s in _STATES]
    handles.append(Patch(facecolor="white", edgecolor="#BBBBBB", label="held by the other ranks"))
    fig.legend(handles=handles, loc="outside lower center", ncols=2, frameon=False, fontsize=8)
    fig.suptitle("What each rank holds: ZeRO stages 0–3 (mixed-precision Adam, K = 12)", fontsize=10)
    return fig


def _local(t):
    """The part of t that lives on this rank: a DTensor's local shard, else t itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _nbytes(t) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


def per_rank_state_bytes(model, optimizer=None) -> dict:
    """Bytes of this rank's parameters, gradients and optimizer state, measured (notebook 08).

    A DTensor (FSDP2's sharded parameters, their gradients and the optimizer state built from them) counts its
    local shard only (`.to_local()`); a plain tensor counts whole. A parameter shared by two modules counts once;
    a parameter without a gradient adds nothing to "grads". Optimizer state: every tensor in optimizer.state
    (Adam's exp_avg and exp_avg_sq, and its one-element step). Call it between steps: during FSDP2's forward and
    backward a module's full parameters are all-gathered, and those buffers are not counted here.

    Returns {"params", "grads", "optimizer", "total"} in bytes.
    """
    import torch

    params = list({id(p): p for p in model.parameters()}.values())
    counts = {"params": sum(_nbytes(p) for p in params),
              "grads": sum(_nbytes(p.grad) for p in params if p.grad is not None),
              "optimizer": 0}
    if optimizer is not None:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    counts["optimizer"] += _nbytes(value)
    counts["total"] = counts["params"] + counts["grads"] + counts["optimizer"]
    return counts


def largest_unshard_bytes(model) -> int:
    """Bytes of the biggest group of parameters one FSDP2 unit all-gathers at once, inside a rank (notebook 08).

    Each fully_shard call makes one group: the parameters of that module not already in a group of a submodule
    (fully_shard's docstring). Counted unsharded (numel × element size of the parameter as registered, so in the
    parameters' dtype, not MixedPrecisionPolicy's param_dtype). 0 for a model without fully_shard. With fully_shard
    on the root alone this is the whole model: what it gathers at once, its peak, as an unsharded model's.
    """
    from torch.distributed.fsdp import FSDPModule

    groups = []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            inner = {id(p) for child in module.modules() if child is not module and isinstance(child, FSDPModule)
                     for p in child.parameters()}
            groups.append(sum(p.numel() * p.element_size() for p in module.parameters() if id(p) not in inner))
    return max(groups, default=0)
