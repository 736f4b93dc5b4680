"""What the planner is asked about: a model's shape, a cluster, a layout (lesson 09 introduces them).

    ModelShape     a Llama-style decoder's sizes (dense or MoE), ModelShape.of(config), parameter counts by part
    LLAMA31_8B, LLAMA31_70B, LLAMA31_405B   Llama 3.1's shapes as torchtitan builds them
    Cluster        GPUs per node, nodes, memory per GPU, the links inside and between nodes, the peak FLOP/s
    H100_GRAND_TETON, A100_80GB_CLUSTER      the machines of torchtitan's published tables
    Layout         the degrees (dp_replicate, dp_shard, tp, pp, cp, ep), micro-batching, checkpointing, ZeRO/FSDP,
                   sequence parallelism and the pipeline schedule of one run

Plain descriptions, no tensors: `notebooks/09_putting_it_together.ipynb` (lesson 09) plans layouts with them before
any run. Every check raises a ValueError that says what to change (a count that is not a whole number is the
course's TypeError, `course_lib.parallel.whole_number`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from course_lib.models.llama import LlamaConfig
from course_lib.parallel import whole_number
from course_lib.parallel.links import LINKS, Link
from course_lib.tables import plural

__all__ = ["ModelShape", "LLAMA31_8B", "LLAMA31_70B", "LLAMA31_405B", "Cluster", "H100_GRAND_TETON",
           "A100_80GB_CLUSTER", "Layout", "CHECKPOINTING", "SCHEDULES"]

CHECKPOINTING = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved")


@dataclass(frozen=True)
class ModelShape:
    """A Llama-style decoder: RMSNorm, grouped-query attention, SwiGLU MLP (or MoE), untied embedding and output.

    n_experts = 0 is a dense model; n_experts > 0 makes every layer's MLP a mixture of experts with top_k routed
    experts of hidden size expert_ffn_hidden and a router (a simplification: no shared expert, no dense layers).
    """

    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    vocab_size: int
    n_experts: int = 0
    top_k: int = 0
    expert_ffn_hidden: int = 0
    name: str = "model"

    def __post_init__(self):
        for field in ("n_layers", "dim", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size"):
            object.__setattr__(self, field, whole_number(getattr(self, field), field))
        for field in ("n_experts", "top_k", "expert_ffn_hidden"):
            object.__setattr__(self, field, whole_number(getattr(self, field), field, minimum=0))
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} must be a multiple of n_heads {self.n_heads} (head_dim = dim/n_heads)")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} must be a multiple of n_kv_heads {self.n_kv_heads}: each KV "
                             "head serves a whole group of query heads")
        if self.n_experts and not (1 <= self.top_k <= self.n_experts and self.expert_ffn_hidden >= 1):
            raise ValueError(f"an MoE shape needs 1 <= top_k <= n_experts ({self.n_experts}), not {self.top_k}, and "
                             f"expert_ffn_hidden >= 1, not {self.expert_ffn_hidden}")
        if not self.n_experts and (self.top_k or self.expert_ffn_hidden):
            raise ValueError("top_k and expert_ffn_hidden are for MoE shapes: set n_experts > 0, or leave them 0")

    @classmethod
    def of(cls, config, name: str | None = None) -> "ModelShape":
        """The shape of any object with vocab_size, dim, n_layers, n_heads, n_kv_heads, ffn_hidden and moe (None, or
        an object with n_experts, top_k and optionally expert_ffn_hidden or ffn_hidden), e.g. a LlamaConfig."""
        missing = [a for a in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden")
                   if not hasattr(config, a)]
        if missing:
            raise ValueError(f"{type(config).__name__} has no {', '.join(missing)}: ModelShape.of needs vocab_size, "
                             "dim, n_layers, n_heads, n_kv_heads, ffn_hidden and moe")
        moe = getattr(config, "moe", None)
        experts = {}
        if moe is not None:
            if not (hasattr(moe, "n_experts") and hasattr(moe, "top_k")):
                raise ValueError(f"config.moe ({type(moe).__name__}) needs n_experts and top_k, or set moe=None")
            hidden = getattr(moe, "expert_ffn_hidden", None) or getattr(moe, "ffn_hidden", None) or config.ffn_hidden
            experts = {"n_experts": moe.n_experts, "top_k": moe.top_k, "expert_ffn_hidden": hidden}
        kv = config.n_kv_heads if config.n_kv_heads is not None else config.n_heads
        return cls(config.n_layers, config.dim, config.n_heads, kv, config.ffn_hidden, config.vocab_size,
                   **experts, name=name or type(config).__name__)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        """n_kv_heads · head_dim: the width of K and of V."""
        return self.n_kv_heads * self.head_dim

    def params(self) -> dict[str, int]:
        """Parameter counts by part: embedding, attention (per layer), mlp (per layer, all experts), mlp_active (per
        layer, the top_k experts and router a token uses), norms (per layer), final_norm, output, layer, total,
        active (the parameters one token uses: total with its top_k experts only), as torchtitan's
        Llama builds them (`torchtitan/models/llama/model.py`: wq, wk, wv, wo; w1, w2, w3; two RMSNorm weights)."""
        h, kv = self.dim, self.kv_dim
        attention = 2 * h * h + 2 * h * kv
        if self.n_experts:
            expert = 3 * h * self.expert_ffn_hidden
            mlp, mlp_active = self.n_experts * expert + h * self.n_experts, self.top_k * expert + h * self.n_experts
        else:
            mlp = mlp_active = 3 * h * self.ffn_hidden
        layer = attention + mlp + 2 * h
        total = 2 * self.vocab_size * h + self.n_layers * layer + h
        active = 2 * self.vocab_size * h + self.n_layers * (attention + mlp_active + 2 * h) + h
        return {"embedding": self.vocab_size * h, "attention": attention, "mlp": mlp, "mlp_active": mlp_active,
                "norms": 2 * h, "final_norm": h, "output": self.vocab_size * h, "layer": layer, "total": total,
                "active": active}


# Llama 3.1's shapes as torchtitan builds them: the same configs lesson 09's model is built from
# (course_lib.models.llama.LlamaConfig.llama3_1, with its sources).
LLAMA31_8B = ModelShape.of(LlamaConfig.llama3_1("8B"), name="Llama 3.1 8B")
LLAMA31_70B = ModelShape.of(LlamaConfig.llama3_1("70B"), name="Llama 3.1 70B")
LLAMA31_405B = ModelShape.of(LlamaConfig.llama3_1("405B"), name="Llama 3.1 405B")


def _positive(x, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x) or x <= 0:
        raise ValueError(f"{what} must be a finite number > 0, not {x!r}")
    return float(x)


@dataclass(frozen=True)
class Cluster:
    """nodes × gpus_per_node GPUs of memory_bytes each; intra_node links GPUs of a node, inter_node is ONE GPU's own
    network link (its NIC); peak_flops the dense bf16 peak per GPU that MFU divides by, with its source."""

    name: str
    gpus_per_node: int
    nodes: int
    memory_bytes: float
    intra_node: Link
    inter_node: Link
    peak_flops: float
    peak_source: str

    def __post_init__(self):
        object.__setattr__(self, "gpus_per_node", whole_number(self.gpus_per_node, "gpus_per_node"))
        object.__setattr__(self, "nodes", whole_number(self.nodes, "nodes"))
        _positive(self.memory_bytes, "memory_bytes")
        _positive(self.peak_flops, "peak_flops")
        for field in ("intra_node", "inter_node"):
            if not isinstance(getattr(self, field), Link):
                raise ValueError(f"{field} must be a course_lib.parallel.links.Link (e.g. LINKS[...]), "
                                 f"not {type(getattr(self, field)).__name__}")

    @property
    def n_gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def with_nodes(self, nodes: int) -> "Cluster":
        """The same machines, `nodes` of them."""
        return Cluster(self.name, self.gpus_per_node, nodes, self.memory_bytes, self.intra_node, self.inter_node,
                       self.peak_flops, self.peak_source)


_TITAN_PEAK = ("torchtitan get_peak_flops (`torchtitan/utils.py` @0011fb90): A100 312e12, H100 SXM 989e12 dense bf16 "
               "('Specifications are one-half lower without sparsity')")

# torchtitan's benchmark machine (benchmarks/llama3_h100_202412_torchtitan.md): "Each host has 8 NVIDIA H100 GPUs
# fully connected with NVLink", "96GB HBM2e", "400 Gb/s per GPU"; the doc uses the SXM peak for these lower-TDP parts.
# 96 GB is taken as 96 GiB: an assumption (the doc does not say which GB).
H100_GRAND_TETON = Cluster("H100 96GB (Grand Teton)", 8, 1, 96 * 2**30, LINKS["NVLink, 8×H100 node"],
                           LINKS["400 Gb/s network (NDR InfiniBand)"], 989e12, _TITAN_PEAK)

# The April 2024 A100 table says only "64 A100 (80GB) GPUs": the NVLink figure is the 8×A100 fit in links.py, the
# network a 400 Gb/s NIC per GPU, both ASSUMPTIONS about a machine the table does not describe.
A100_80GB_CLUSTER = Cluster("A100 80GB (network assumed)", 8, 8, 80 * 2**30,
                            LINKS["NVLink, 8×A100 node (fitted to a real log)"],
                            LINKS["400 Gb/s network (NDR InfiniBand)"], 312e12, _TITAN_PEAK)


@dataclass(frozen=True)
class Layout:
    """How one run spreads over the GPUs: dp_replicate × dp_shard × cp × tp × pp GPUs (torchtitan's mesh, innermost
    last: pp, dp_replicate, dp_shard, cp, tp), and ep borrowed from dp_shard × cp × tp for the experts.

    micro_batch: sequences per micro-batch on one data-parallel rank; n_microbatches: micro-batches per step (the
    pipeline's m, or gradient accumulation without PP). zero_stage: how the model state is sharded over the
    dp_shard × cp ranks (torchtitan's FSDP mesh), with ZeRO's meaning (course_lib.parallel.sharding): 3 is FSDP2's
    fully_shard, 0 replicates (DDP). sequence_parallel: Korthikanti et al.'s SP beside TP (ignored at tp = 1).
    pp_schedule: "gpipe", "1f1b" or "interleaved" (virtual_stages stages per GPU, interleaved only).
    activation_checkpointing: "none", "selective" (torchtitan's per-op SAC) or "full" (every layer).
    """

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    micro_batch: int = 1
    n_microbatches: int = 1
    activation_checkpointing: str = "selective"
    zero_stage: int = 3
    sequence_parallel: bool = True
    pp_schedule: str = "1f1b"
    virtual_stages: int = 1

    def __post_init__(self):
        for field in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep", "micro_batch", "n_microbatches",
                      "virtual_stages"):
            object.__setattr__(self, field, whole_number(getattr(self, field), field))
        stage = whole_number(self.zero_stage, "zero_stage", minimum=0, integral_floats=False)
        if stage > 3:
            raise ValueError(f"zero_stage is 0 (DDP), 1, 2 or 3 (FSDP2's fully_shard), not {stage}")
        if self.activation_checkpointing not in CHECKPOINTING:
            raise ValueError(f"activation_checkpointing must be one of {CHECKPOINTING}, "
                             f"not {self.activation_checkpointing!r}")
        if self.pp_schedule not in SCHEDULES:
            raise ValueError(f"pp_schedule must be one of {SCHEDULES}, not {self.pp_schedule!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise ValueError(f"sequence_parallel must be True or False, not {self.sequence_parallel!r}")
        if (self.pp_schedule == "interleaved") != (self.virtual_stages > 1):
            raise ValueError("virtual_stages > 1 goes with pp_schedule='interleaved' and only with it: set both, "
                             f"or neither (got {self.pp_schedule!r} with virtual_stages={self.virtual_stages})")
        if self.pp > 1 and self.pp_schedule != "gpipe" and self.n_microbatches < self.pp:
            raise ValueError(f"{self.pp_schedule} needs n_microbatches >= pp ({self.pp}), not {self.n_microbatches}: "
                             "raise n_microbatches or lower pp")
        if self.pp_schedule == "interleaved" and self.pp > 1 and self.n_microbatches % self.pp:
            raise ValueError(f"interleaved 1F1B needs n_microbatches ({self.n_microbatches}) to be a multiple of pp "
                             f"({self.pp}) (Narayanan et al. 2021 §2.2)")
        if (self.dp_shard * self.cp * self.tp) % self.ep:
            raise ValueError(f"ep ({self.ep}) borrows its ranks from dp_shard × cp × tp "
                             f"({self.dp_shard * self.cp * self.tp}): it must divide that product")

    @property
    def n_gpus(self) -> int:
        return self.dp_replicate * self.dp_shard * self.cp * self.tp * self.pp

    @property
    def fsdp(self) -> int:
        """The ranks the model state is sharded over: dp_shard × cp (torchtitan's `dp_shard_cp` mesh)."""
        return self.dp_shard * self.cp

    @property
    def local_batch(self) -> int:
        """Sequences per step on one data-parallel rank: micro_batch × n_microbatches."""
        return self.micro_batch * self.n_microbatches

    def layers_per_gpu(self, shape: ModelShape) -> int:
        """Layers on the most loaded GPU: ceil(n_layers / (pp·virtual_stages)) per stage, virtual_stages stages per
        GPU. Where pp·v does not divide n_layers some stages get one layer fewer (126 layers on 8 stages: 16 and
        15); the planner prices the fuller ones (an assumption about the split, which torchtitan lets one choose)."""
        chunks = self.pp * self.virtual_stages
        return -(-shape.n_layers // chunks) * self.virtual_stages

    def global_batch(self) -> int:
        """Sequences per step over all GPUs: local_batch × dp_replicate × dp_shard."""
        return self.local_batch * self.dp_replicate * self.dp_shard

    def check_against(self, shape: ModelShape, seq_len: int, n_gpus: int | None = None) -> None:
        """ValueError if this layout cannot run `shape` at `seq_len` (on `n_gpus`, when given), saying why."""
        seq_len = whole_number(seq_len, "seq_len")
        if n_gpus is not None and self.n_gpus != n_gpus:
            raise ValueError(f"the degrees multiply to {plural(self.n_gpus, 'GPU')}, not {n_gpus}: dp_replicate × "
                             "dp_shard × cp × tp × pp must be the GPU count")
        if shape.n_heads % self.tp or shape.n_kv_heads % self.tp:
            raise ValueError(f"tp ({self.tp}) must divide n_heads ({shape.n_heads}) and n_kv_heads "
                             f"({shape.n_kv_heads}): each TP rank holds whole heads")
        if shape.n_layers < self.pp * self.virtual_stages:
            raise ValueError(f"pp × virtual_stages ({self.pp * self.virtual_stages}) stages need at least as many "
                             f"layers, not {shape.n_layers}: lower pp or virtual_stages")
        if seq_len % (2 * self.cp) and self.cp > 1:
            raise ValueError(f"seq_len ({seq_len}) must be a multiple of 2·cp ({2 * self.cp}): the load-balanced "
                             "causal split gives each CP rank two chunks")
        if self.ep > 1 and (not shape.n_experts or shape.n_experts % self.ep):
            raise ValueError(f"ep ({self.ep}) needs an MoE shape whose n_experts ({shape.n_experts}) it divides")
