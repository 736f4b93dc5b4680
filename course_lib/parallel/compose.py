"""Composing the parallelisms on lesson 09's Llama: a device mesh, tensor parallelism with sequence parallelism,
FSDP2 or HSDP, and pipeline stages, in torchtitan's order (introduced by lesson 09,
notebooks/09_putting_it_together.ipynb).

    check_mesh_sizes(sizes, world_size)   the mesh's mistakes as ValueErrors, before any process group exists
    build_mesh(sizes)                     init_device_mesh over the launched ranks, e.g. {"pp": 2, "dp": 2, "tp": 2}
    parallelize(module, mesh, plan)       parallelize_module that refuses a plan key matching no submodule
    apply_tp(model, tp_mesh)              torchtitan's TP plan, with sequence parallelism (default) or without
    apply_fsdp(model, dp_mesh)            fully_shard each block, then the root; HSDP on a 2-D mesh
    stage_layers(n_layers, pp)            torchtitan's cut: which layers each pipeline stage keeps
    cut_stage(model, pp_mesh)             delete the other stages' layers, embedding, norm and output
    pipeline_schedule(model, pp_mesh, m)  a PipelineStage and its Schedule1F1B or ScheduleGPipe
    build_model(config, mesh)             meta -> stage -> TP -> FSDP -> to_empty -> init_weights: a Composed model
    train_step(composed, tokens, labels)  one forward, backward and SGD step of the global batch; the loss
    gather_full(model)                    every parameter and gradient as a plain full tensor (full_tensor())

Sources: torchtitan's `apply_tp` and `apply_fsdp` (torchtitan/models/llama3/infra/parallelize.py @018740b7), its
mesh (torchtitan/distributed/parallel_dims.py @0119de15: dims pp, dp_replicate, dp_shard, cp, tp, outermost first)
and its pipeline cut (torchtitan/distributed/pipeline_parallel.py @02ef790c, `generate_llm_fqn_per_model_part`,
`pipeline_module_split`); torch 2.14.1's `parallelize_module` (tensor/parallel/api.py), `fully_shard`
(fsdp/_fully_shard/_fully_shard.py) and `pipelining` (stage.py, schedules.py). What ran on gloo: research §2.
Context parallelism and experts are exercise 09's to write, by hand: build_model refuses cp > 1.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Any, Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, loss_parallel, parallelize_module)

from course_lib.models.llama import Llama, LlamaConfig
from course_lib.tables import plural

__all__ = ["DIM_ORDER", "check_mesh_sizes", "build_mesh", "parallelize", "apply_tp", "apply_fsdp", "stage_layers",
           "cut_stage", "pipeline_schedule", "Composed", "build_model", "train_step", "cross_entropy", "gather_full"]

# torchtitan's ParallelDims, outermost first; "dp" is accepted for dp_shard (plain FSDP), as research §2 names it.
DIM_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
_ALIAS = {"dp": "dp_shard"}


def check_mesh_sizes(sizes: Mapping[str, int], world_size: int,
                     ranks_per_node: int | None = None) -> dict[str, int]:
    """`sizes` as a dict in mesh order, or a ValueError that names the mistake and what to write instead: an unknown
    or repeated dimension, sizes whose product is not world_size, dimensions out of torchtitan's order (tp not
    last), or tp groups that would cross nodes of ranks_per_node ranks. With tp innermost, init_device_mesh puts
    ranks r·tp .. r·tp + tp − 1 in one TP group: consecutive ranks, one node's GPUs when tp divides a node's count."""
    if not isinstance(sizes, Mapping) or not sizes:
        raise ValueError(f"sizes must be a non-empty dict such as {{'dp': 2, 'tp': 2}}, not {sizes!r}")
    for name, size in sizes.items():
        if name not in DIM_ORDER + tuple(_ALIAS):
            raise ValueError(f"unknown mesh dimension {name!r}: the names are torchtitan's, {', '.join(DIM_ORDER)} "
                             f"(and 'dp' for dp_shard)")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"mesh dimension {name!r} needs a whole number of ranks, 1 or more, not {size!r}")
    canonical = [_ALIAS.get(name, name) for name in sizes]
    if len(set(canonical)) < len(canonical):
        raise ValueError(f"{list(sizes)} names dp_shard twice ('dp' is dp_shard): keep one of them")
    total = math.prod(sizes.values())
    if total != world_size:
        raise ValueError(f"the mesh {dict(sizes)} holds {plural(total, 'rank')} but {world_size} were launched: "
                         f"make the sizes multiply to {world_size}")
    order = sorted(sizes, key=lambda name: DIM_ORDER.index(_ALIAS.get(name, name)))
    if list(sizes) != order:
        fixed = {name: sizes[name] for name in order}
        why = ("tp must be the innermost (last, fastest-varying) dimension: init_device_mesh gives the last "
               "dimension consecutive ranks, which share a node, and TP's all-gathers and reduce-scatters run in "
               "every layer, forward and backward, so they need a node's fast links (NVLink)"
               if "tp" in sizes and list(sizes)[-1] != "tp" else
               "dimensions go outermost first, in torchtitan's order pp, dp_replicate, dp_shard, cp, tp")
        raise ValueError(f"mesh dimensions {tuple(sizes)} are out of order: {why}. Write {fixed}")
    tp = sizes.get("tp", 1)
    if ranks_per_node is not None and ranks_per_node % tp:
        raise ValueError(f"tp={tp} does not divide the {plural(ranks_per_node, 'rank')} of a node: some TP groups "
                         f"would span two nodes, and TP's per-layer collectives would cross the slow inter-node "
                         f"network. Keep tp a divisor of the GPUs per node (at most {ranks_per_node}); put the rest "
                         f"in dp or pp")
    return {name: sizes[name] for name in order}


def build_mesh(sizes: Mapping[str, int], *, ranks_per_node: int | None = None) -> DeviceMesh:
    """A DeviceMesh over every launched rank, its dimensions named as in `sizes` (checked by check_mesh_sizes;
    ranks_per_node defaults to torchrun's LOCAL_WORLD_SIZE, which course_lib.dist.launch sets to the world size).
    The device is the ranks' (cpu under gloo). Each dimension's process group gets the world group's timeout:
    torch 2.14.1's DeviceMesh makes them with new_group(timeout=None), which would mean the backend's default
    (distributed_c10d._get_default_timeout: 30 minutes)."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    sizes = check_mesh_sizes(sizes, dist.get_world_size(), ranks_per_node or (int(local) if local.isdigit() else None))
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    mesh = init_device_mesh(device, tuple(sizes.values()), mesh_dim_names=tuple(sizes))
    try:  # the backend's options are not public API; without them the groups keep the default
        timeout = dist.group.WORLD._get_backend(torch.device(device)).options._timeout
    except (AttributeError, RuntimeError):
        return mesh
    for name in sizes:
        dist.set_timeout(timeout, mesh.get_group(name))
    return mesh


def parallelize(module: nn.Module, tp_mesh: DeviceMesh, plan: dict[str, ParallelStyle]) -> nn.Module:
    """parallelize_module(module, tp_mesh, plan), after checking that each key of the plan names a submodule.
    torch 2.14.1 (tensor/parallel/api.py) only warns "Parallelize plan key ... could not be resolved" and skips the
    entry: that module's parameters stay plain, unsharded tensors (the tests check both). Here it is a ValueError."""
    names = [name for name, _ in module.named_modules() if name]
    for key in [k for k in plan if k and not _resolves(module, k.split("."))]:
        raise ValueError(f"plan key {key!r} matches no submodule of {type(module).__name__}, so parallelize_module "
                         f"would skip it: use one of {names[:24]}{' ...' if len(names) > 24 else ''} (fnmatch "
                         f"patterns such as 'layers.*' work)")
    return parallelize_module(module, tp_mesh, plan)


def _resolves(module: nn.Module, tokens: list[str]) -> bool:
    """Whether the path matches a submodule as parallelize_module walks it: fnmatch token by token on children."""
    children = [child for name, child in module.named_children() if fnmatch(name, tokens[0])]
    return bool(children) and (len(tokens) == 1 or any(_resolves(c, tokens[1:]) for c in children))


def apply_tp(model: Llama, tp_mesh: DeviceMesh, *, sequence_parallel: bool = True,
             loss_parallel: bool = False) -> Llama:
    """torchtitan's `apply_tp` on a Llama or a stage of one (less its q_norm/k_norm keys, which this model lacks):
    Megatron's column-then-row split of wq/wk/wv/wo and w1/w3/w2, each rank a slice of the heads and of the hidden
    units. sequence_parallel (torchtitan's only mode): the norms run on a slice of the sequence (Shard(1)), each
    row-parallel all-reduce becomes a reduce-scatter and the next module's input an all-gather, the same bytes
    (Korthikanti et al. 2022, arXiv 2205.05198). Measured per layer and step (tests): 4 all-gathers and 4
    reduce-scatters, + 2 all-reduces of the norm weights' gradients; without SP, activations replicated, 7
    all-reduces (wo and w2 forward; backward, one per column-parallel module's input gradient: wq, wk, wv, w1, w3).
    loss_parallel: the logits stay a DTensor sharded on the vocabulary, for torch's `loss_parallel()` (train_step);
    otherwise they are all-gathered into a plain tensor."""
    seq = Shard(1) if sequence_parallel else Replicate()
    root = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                      use_local_output=not loss_parallel)}
    if not sequence_parallel:
        del root["norm"]
    parallelize(model, tp_mesh, {k: v for k, v in root.items() if getattr(model, k) is not None})
    for block in model.layers.values():
        plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(output_layouts=seq),
                "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=seq)}
        if sequence_parallel:  # attention takes (x, rope_cos, rope_sin, positions): only x is sharded
            plan |= {"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                     "attention": PrepareModuleInput(input_layouts=(seq, None, None, None),
                                                     desired_input_layouts=(Replicate(), None, None, None)),
                     "feed_forward": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))}
        parallelize(block, tp_mesh, plan)
    return model


def apply_fsdp(model: Llama, dp_mesh: DeviceMesh, *, reshard_after_forward: bool = True,
               mp_policy: MixedPrecisionPolicy | None = None) -> Llama:
    """FSDP2 as torchtitan's `apply_fsdp` groups it, less its separate embedding and [norm, output] units:
    fully_shard on each block (one all-gather per block in forward, another in backward when reshard_after_forward,
    one reduce-scatter of its gradients), then on the model (the embedding, norm and output, and the root: torch
    sets the root's reshard_after_forward to False, fully_shard's docstring). A 2-D dp_mesh ("dp_replicate",
    "dp_shard") is HSDP: placements (Replicate(), Shard(0)), gradients reduce-scattered over dp_shard then
    all-reduced over dp_replicate. Parameters already TP DTensors are sharded on dim 0 over dp_mesh as well."""
    names = tuple(_ALIAS.get(n, n) for n in dp_mesh.mesh_dim_names or ())
    if dp_mesh.ndim > 2 or names and (names[0] in ("pp", "dp_replicate", "cp", "tp") if dp_mesh.ndim == 1
                                      else names != ("dp_replicate", "dp_shard")):
        raise ValueError(f"fully_shard shards over a 1-D mesh (FSDP: mesh['dp']) and, on a 2-D one, replicates over "
                         f"its first dimension and shards over its second (HSDP: mesh['dp_replicate', 'dp_shard'], "
                         f"dp_shard may be 1): pass one of those, not {dp_mesh.mesh_dim_names}")
    config: dict[str, Any] = {"mesh": dp_mesh, "mp_policy": mp_policy or MixedPrecisionPolicy()}
    for block in model.layers.values():
        fully_shard(block, reshard_after_forward=reshard_after_forward, **config)
    fully_shard(model, **config)
    return model


def stage_layers(n_layers: int, pp: int) -> list[list[str]]:
    """The layer names each of pp stages keeps: torchtitan's `generate_llm_fqn_per_model_part` with its default
    weights, the embedding and the norm+output each counted as one layer, and the n_layers + 2 shared out evenly,
    the first stages taking one more where they do not divide. {4 layers, pp 2}: ["0", "1"], ["2", "3"]."""
    effective = n_layers + 2
    if pp > 1 and effective // pp < 1:
        raise ValueError(f"pp={pp} stages for {plural(n_layers, 'layer')} (+ embedding and output) would leave a "
                         f"stage empty: lower pp to at most {effective}")
    if pp == 1:
        return [[str(i) for i in range(n_layers)]]
    counts = [effective // pp + (s < effective % pp) for s in range(pp)]
    counts[0], counts[-1] = counts[0] - 1, counts[-1] - 1
    starts = [sum(counts[:s]) for s in range(pp)]
    return [[str(i) for i in range(start, start + count)] for start, count in zip(starts, counts)]


def cut_stage(model: Llama, pp_mesh: DeviceMesh) -> Llama:
    """Keep this rank's pipeline stage of `model` (on meta: nothing is allocated): delete the other layers by name,
    as torchtitan's `pipeline_module_split` does, and set tok_embeddings to None off the first stage, norm and
    output off the last. Layer names keep their numbers ("2", "3"), so init_weights gives them the full model's
    values and a checkpoint's names still match."""
    stage, n_stages = pp_mesh.get_local_rank(), pp_mesh.size()
    keep = set(stage_layers(len(model.layers), n_stages)[stage])
    for name in [name for name in model.layers if name not in keep]:
        del model.layers[name]
    if stage > 0:
        model.tok_embeddings = None
    if stage < n_stages - 1:
        model.norm, model.output = None, None
    return model


def pipeline_schedule(model: nn.Module, pp_mesh: DeviceMesh, n_microbatches: int, *, schedule: str = "1f1b",
                      loss_fn=None):
    """(PipelineStage, schedule) for this rank's stage: torch.distributed.pipelining's Schedule1F1B ("1f1b") or
    ScheduleGPipe ("gpipe"), passing activations over pp_mesh's group. Shapes are inferred from the first
    micro-batch (PipelineStage's dynamic mode). The schedule divides gradients by n_microbatches (scale_grads=True,
    torch 2.14.1's default), so with a mean loss per micro-batch they are those of the whole batch's mean."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    classes = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}
    if schedule not in classes:
        raise ValueError(f"schedule must be one of {sorted(classes)}, not {schedule!r}")
    if schedule == "1f1b" and n_microbatches < pp_mesh.size():
        raise ValueError(f"1F1B needs at least as many micro-batches as stages: n_microbatches={n_microbatches} < "
                         f"pp={pp_mesh.size()}; raise n_microbatches or use schedule='gpipe'")
    device = torch.device(pp_mesh.device_type, torch.cuda.current_device() if pp_mesh.device_type == "cuda" else None)
    stage = PipelineStage(model, pp_mesh.get_local_rank(), pp_mesh.size(), device, group=pp_mesh.get_group())
    return stage, classes[schedule](stage, n_microbatches=n_microbatches, loss_fn=loss_fn or cross_entropy)


@dataclass
class Composed:
    """What build_model returns: this rank's model (a stage of it under PP), its mesh, and under PP its stage and
    schedule. first/last: whether this rank runs the pipeline's first/last stage (both without PP)."""

    model: Llama
    mesh: DeviceMesh
    stage: Any = None
    schedule: Any = None
    first: bool = True
    last: bool = True
    loss_parallel: bool = False


def build_model(config: LlamaConfig, mesh: DeviceMesh, *, seed: int = 0, sequence_parallel: bool = True,
                loss_parallel: bool = False, reshard_after_forward: bool | None = None,
                mp_policy: MixedPrecisionPolicy | None = None, n_microbatches: int | None = None,
                schedule: str = "1f1b") -> Composed:
    """This rank's part of a Llama on `mesh` (build_mesh's): built on meta, cut to its pipeline stage ("pp"), tensor
    parallel ("tp"), FSDP2 over "dp"/"dp_shard" or HSDP over ("dp_replicate", "dp_shard"), then to_empty and
    init_weights(seed), which fills each shard with its piece of the full tensor, one parameter at a time: the full
    model never exists on any rank. reshard_after_forward None: False under PP, as torchtitan (per micro-batch
    all-gathers otherwise), else True. n_microbatches: per step under PP (default pp)."""
    dims = dict(zip(mesh.mesh_dim_names or (), mesh.shape))
    if dims.get("cp", 1) > 1:
        raise ValueError("build_model applies no context parallelism (torch's needs a GPU, research §4.1): exercise "
                         "09 writes it by hand; leave cp out of the mesh")
    pp = dims.get("pp", 1)
    if loss_parallel and pp > 1:
        raise ValueError("build_model does not combine loss_parallel with pp > 1 (not tried: the last stage's "
                         "logits would be a DTensor through the schedule's loss): use loss_parallel=False")
    with torch.device("meta"):
        model = Llama(config)
    if pp > 1:
        cut_stage(model, mesh["pp"])
    if dims.get("tp", 1) > 1:
        apply_tp(model, mesh["tp"], sequence_parallel=sequence_parallel, loss_parallel=loss_parallel)
    dp = _dp_dims(mesh)
    if dp:
        apply_fsdp(model, mesh[dp] if len(dp) == 2 else mesh[dp[0]], mp_policy=mp_policy,
                   reshard_after_forward=pp == 1 if reshard_after_forward is None else reshard_after_forward)
    model.to_empty(device="cuda" if mesh.device_type == "cuda" else "cpu")
    model.init_weights(seed)
    composed = Composed(model, mesh, loss_parallel=loss_parallel)
    if pp > 1:
        composed.stage, composed.schedule = pipeline_schedule(model, mesh["pp"], n_microbatches or pp,
                                                              schedule=schedule)
        composed.first, composed.last = composed.stage.is_first, composed.stage.is_last
    return composed


def _dp_dims(mesh: DeviceMesh) -> tuple[str, ...]:  # FSDP's, HSDP's or none, outer first
    return tuple(n for n in (mesh.mesh_dim_names or ()) if n in ("dp_replicate", "dp_shard", "dp"))


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean next-token loss of logits (batch, seq, vocab); a vocabulary-sharded DTensor (apply_tp's
    loss_parallel) must be passed, and its backward run, under torch's `loss_parallel()` context (train_step does)."""
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def train_step(composed: Composed, tokens: torch.Tensor, labels: torch.Tensor, *, lr: float = 0.1) -> float | None:
    """One step on the global batch (tokens, labels: (batch, seq), the same on every rank): this rank takes the rows
    of its data-parallel index (dp_replicate × dp_shard, contiguous), runs forward and backward (the schedule under
    PP), then SGD with lr. Returns the global batch's mean loss (averaged over the data-parallel ranks) on the
    ranks that compute a loss (the last stage), None on the others."""
    dp = _dp_dims(composed.mesh)
    index, size = 0, 1
    for name in dp:  # the data-parallel rank, dp_replicate outer
        sub = composed.mesh[name]
        index, size = index * sub.size() + sub.get_local_rank(), size * sub.size()
    if tokens.shape[0] % size:
        raise ValueError(f"a batch of {plural(tokens.shape[0], 'sequence')} does not split over "
                         f"{plural(size, 'data-parallel rank')}")
    tokens, labels = tokens.chunk(size)[index], labels.chunk(size)[index]
    model, loss = composed.model, None
    with warnings.catch_warnings():
        # TP's all-gathered logits are a view; FSDP2 warns that an in-place op on one would skip its hook: none here
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        if composed.schedule is not None:
            losses: list[torch.Tensor] = []
            composed.schedule.step(*([tokens] if composed.first else []), target=labels if composed.last else None,
                                   losses=losses)
            loss = torch.stack(losses).mean().detach() if composed.last else None
        else:
            with loss_parallel() if composed.loss_parallel else nullcontext():
                loss = cross_entropy(model(tokens), labels)
                loss.backward()
            loss = loss.detach().full_tensor() if isinstance(loss, DTensor) else loss.detach()
    torch.optim.SGD(model.parameters(), lr=lr).step()
    if loss is None:
        return None
    for name in dp:
        dist.all_reduce(loss, group=composed.mesh.get_group(name))
    return loss.item() / size


def gather_full(model: nn.Module) -> dict[str, dict[str, torch.Tensor]]:
    """{"params": {name: tensor}, "grads": {name: tensor}}: every parameter of this rank's model and its gradient as
    plain full tensors (DTensor.full_tensor(), a collective: call it on every rank of the mesh). A TP+FSDP weight
    gathers in two steps, which torch logs as "suboptimal" (research §4.6; tensor/_redistribute.py's logger.warning):
    that log is silenced here."""
    out: dict[str, dict[str, torch.Tensor]] = {"params": {}, "grads": {}}
    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    level, _ = logger.level, logger.setLevel(logging.ERROR)
    try:
        for name, p in model.named_parameters():
            for kind, t in (("params", p.detach()), ("grads", p.grad)):
                if t is not None:
                    out[kind][name] = (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
    finally:
        logger.setLevel(level)
    return out
