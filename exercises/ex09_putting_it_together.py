# Exercise file: replace each `raise NotImplementedError(...)` with your code,
# then run `check("ex09")` in the notebook (or `python3 course.py check ex09`).
"""Exercise 09: Putting it together. Ring attention, expert-parallel MoE dispatch and combine, a layout's memory.

Notebook: notebooks/09_putting_it_together.ipynb

Three pieces a model that uses every parallelism needs and torch does not hand a CPU learner: ring attention
(context parallelism: each rank holds a chunk of the sequence, and the keys and values travel around a ring of
ranks while each rank folds one block at a time into its output with the online softmax; Milakov & Gimelshein
2018, arXiv:1805.02867; Liu, Zaharia & Abbeel 2023, arXiv:2310.01889); expert parallelism's dispatch and combine
(each rank owns some of a mixture-of-experts layer's experts: the tokens travel to their experts' owners with an
all-to-all and back with another; Lepikhin et al. 2020, GShard, arXiv:2006.16668); and the bytes of model state one
GPU holds when a Llama-style model is laid out with FSDP, tensor and pipeline parallelism together. Everything runs
on the CPU, in gloo ranks. The tests compare with references computed in the test process (full attention on the
whole sequence, a single-process MoE that loops over tokens, the parameters counted on a model built on the meta
device), log every message and collective your code starts, and switch off torch's context parallelism and the
lesson's own models and planner while your code runs.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import torch
import torch.distributed as dist


# ---------------------------------------------------------------- ring attention

def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group: Any = None,
                   causal: bool = True) -> torch.Tensor:
    """This rank's chunk of softmax(q kᵀ / √head_dim + mask) v over the whole sequence, computed around a ring.

    Called in every rank of `group` (None: the default group), n ranks, rank r (its rank in the group). The
    sequence of S = n·c positions is cut into n contiguous chunks of c: rank r holds positions r·c .. (r+1)·c - 1
    of the queries, keys and values, q, k and v, each shaped (batch, heads, c, head_dim), the same shape on every
    rank (the caller's promise: checking it across ranks would take a message). The result is rank r's rows of
    attention over the WHOLE sequence, shaped like q: with `causal`, position i attends to positions 0..i only (a
    query sees its own key); without, to every position.

    No rank ever holds all the keys: the n blocks of (k, v) travel around the ring. Rank r starts with its own
    block; in each of n - 1 passes it sends the block it holds to rank (r + 1) % n and receives the next one from
    rank (r - 1) % n (dist.isend / dist.irecv, or dist.batch_isend_irecv of dist.P2POp(..., group_peer=...), k and
    v as two messages of one chunk each, in the inputs' dtype), so it sees the blocks of ranks r, r - 1, ...,
    r - n + 1 (mod n), one after the other, holding at most the block it computes with and the one arriving. Post a
    pass's sends and receives before computing with the block you hold and wait for them (work.wait()) after, so
    the transfer overlaps the computation (Liu et al. 2023). With n = 1 nothing is sent.
    Each block is folded into a running output with the online softmax (Milakov & Gimelshein 2018), per query
    row: the scores s = q kᵀ/√head_dim of the block (masked to -inf where a key comes after the query), then
    m' = max(m, max_j s_j), l' = l·e^(m - m') + Σ_j e^(s_j - m'), o' = o·e^(m - m') + Σ_j e^(s_j - m') v_j,
    starting from m = -inf, l = 0, o = 0; the result is o / l. Subtracting the running max keeps every exponent
    at most 0, so nothing overflows even where the scores are in the hundreds. Under `causal`, a block from a
    later rank (source j > r) is masked entirely: skip its computation (it is still passed on); the own block
    (j = r) is masked above its diagonal; earlier blocks are seen whole. No row is ever all -inf then (the own
    block comes first, and a query sees itself), so no NaN appears.
    Precision: the scores, m, l and o are computed in float32 for lower-precision inputs (bfloat16, float16), in
    float64 for float64 (torch.promote_types(dtype, float32)); the result is rounded once to the inputs' dtype.
    Forward only: no backward through the ring is asked for (the result need not carry autograd history).
    Returns a new tensor (q, k and v are left unchanged and are not the result), of q's shape, dtype and device.
    Raises ValueError, before any message is sent, naming the argument to fix (before any other), unless q, k and v
    are 4-dimensional floating tensors of the same shape, dtype and device.
    """
    raise NotImplementedError("check the inputs before any message; then the n blocks: post the pass's isend to r+1 and irecv from r-1 (k and v), fold the held block (skip a later rank's under causal, mask the own block's upper triangle), wait, hold what arrived; o / l, cast back")


def _check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """ValueError, naming the argument, unless q, k and v are 4-d floating tensors of one shape, dtype and device."""
    raise NotImplementedError('each is a tensor, 4-d and floating; k and v like q in shape, dtype and device')


# ---------------------------------------------------------------- expert parallelism: dispatch and combine

class DispatchPlan(NamedTuple):
    """What moe_dispatch tells moe_combine: where each row went, and how to weigh what comes back."""

    kept: torch.Tensor  # (T, k) bool: which of this rank's assignments were kept (the others were dropped)
    order: torch.Tensor  # (rows sent,) int64: the flat index t * k + j of the assignment behind each row sent
    send_splits: list[int]  # rows sent to each rank of the group
    recv_splits: list[int]  # rows received from each rank of the group
    regroup: torch.Tensor  # (rows received,) int64: returned row i is row regroup[i] of what arrived
    gates: torch.Tensor  # (T, k) the gates, as given


def moe_dispatch(x: torch.Tensor, expert_ids: torch.Tensor, gates: torch.Tensor, *, n_experts: int, capacity: int,
                 group: Any = None) -> tuple[torch.Tensor, list[int], DispatchPlan]:
    """Send this rank's tokens to the ranks that own their experts (expert parallelism): (tokens, counts, plan).

    Called in every rank of `group` (None: the default group), ep ranks; rank r owns the E / ep experts
    r·E/ep .. (r+1)·E/ep - 1 of E = `n_experts` (its local experts 0 .. E/ep - 1). x, shaped (T, dim), holds this
    rank's T tokens (T may differ between ranks, and be 0); `expert_ids` (T, k), integers, the k distinct experts
    the router chose for each token; `gates` (T, k), floating, their weights (moe_combine uses them).
    Capacity, as GShard's local group dispatching (each rank's tokens are one group): each expert takes at most
    `capacity` of THIS rank's assignments, the first ones in token order (token t's before token t + 1's, a
    token's k choices in their order); the rest are dropped, never sent (their tokens skip the expert: they add 0
    in moe_combine). Expert e may then receive up to ep · capacity rows.
    Communication, exactly two dist.all_to_all_single calls: first the counts (a tensor of E integers: how many
    rows this rank sends to each expert; rank p receives the counts of its own experts from every rank), then the
    tokens, with uneven splits (input_split_sizes: rows sent to each rank, output_split_sizes: rows received from
    each). The rows a rank sends are its kept assignments sorted by expert (token order within an expert), so they
    arrive grouped by source rank, then expert; reorder them by local expert.
    Returns:
    - tokens, (R, dim), x's dtype: the R rows this rank received, grouped by local expert (all of local expert 0's
      rows first), within an expert by source rank, within a source in token order; row = that token's x;
    - counts, a list of E / ep ints: the rows of each local expert (they add up to R);
    - plan, a DispatchPlan: `kept` (T, k) bool, True where an assignment was kept; the other fields as their
      comments say (moe_combine reads them).
    x, expert_ids and gates are left unchanged. Raises ValueError, before any communication, naming the argument
    to fix (before any other), unless x is a 2-d floating tensor, expert_ids a (T, k) integer tensor (k >= 1) of
    distinct experts per token in 0 .. E - 1, gates a floating tensor of expert_ids' shape, n_experts a multiple of
    the group's size and capacity a whole number 0 or more.
    """
    raise NotImplementedError("check everything; keep each expert's first `capacity` assignments (cumulative count per expert in flat t*k+j order); sort the kept ones by expert (stable); all_to_all_single the per-expert counts, then the rows with uneven splits; reorder what arrived by (local expert, source)")


def moe_combine(expert_out: torch.Tensor, plan: DispatchPlan, *, group: Any = None) -> torch.Tensor:
    """Send the experts' outputs back and weigh them: out[t] = Σ over token t's kept assignments j of gates[t, j] ·
    (the expert's output row for that assignment).

    Called in every rank of `group` (the group moe_dispatch ran in) with this rank's `plan` from moe_dispatch and
    `expert_out`, shaped (R, dim_out): row i is the output of the expert for row i of the tokens moe_dispatch
    returned (dim_out may differ from dim). One dist.all_to_all_single sends every row back to the rank its token
    came from (moe_dispatch's splits, swapped). A dropped assignment adds 0; a token with every assignment dropped
    gets a row of zeros. Returns a new (T, dim_out) tensor of expert_out's dtype (the gates cast to it), on this
    rank's tokens in their order; expert_out is left unchanged. Raises ValueError naming expert_out, before any
    communication, unless it is a 2-d tensor of R rows.
    """
    raise NotImplementedError("check the rows; undo the regrouping; all_to_all_single back with the splits swapped; weigh each returned row by its gate and index_add it into its token's row")


def _check_routing(x: torch.Tensor, expert_ids: torch.Tensor, gates: torch.Tensor, n_experts: Any, capacity: Any,
                   ep: int) -> None:
    """ValueError, naming the argument, for anything moe_dispatch's docstring refuses (no communication)."""
    raise NotImplementedError("x 2-d floating; expert_ids (T, k) integer, k >= 1, values in range, distinct per row; gates floating of expert_ids' shape; n_experts a whole multiple of ep; capacity a whole number >= 0")


def _describe(value: Any) -> str:
    return f"a {tuple(value.shape)} {value.dtype} tensor" if isinstance(value, torch.Tensor) else repr(value)


# ---------------------------------------------------------------- the memory of a layout

class LlamaShape(NamedTuple):
    """A Llama-style decoder's sizes. Llama 3 8B: LlamaShape(128256, 4096, 32, 32, 8, 14336), 8,030,261,248
    parameters."""

    vocab: int  # tokens: the embedding's rows and the output layer's rows (not tied)
    dim: int  # the model's width
    n_layers: int
    n_heads: int  # query heads; head_dim = dim / n_heads
    n_kv_heads: int  # key and value heads (grouped-query attention; n_heads without it)
    ffn_dim: int  # the SwiGLU MLP's hidden width


class Layout(NamedTuple):
    """How many GPUs each parallelism spans: fsdp · tp · pp GPUs in all."""

    fsdp: int = 1
    tp: int = 1
    pp: int = 1


BYTES_PER_ELEMENT = {"params": 2, "grads": 2, "optimizer": 12}  # bf16, bf16, fp32 master + AdamW's two moments


def plan_memory(model: LlamaShape, layout: Layout, stage: int) -> dict[str, int]:
    """Bytes of model state each GPU of pipeline stage `stage` holds: {"params", "grads", "optimizer", "total"}.

    The model (torchtitan's Llama names; a weight shaped as nn.Linear's, (out, in); no biases; h = dim / n_heads):
    tok_embeddings (vocab, dim); in each of the n_layers layers attention.wq (n_heads·h, dim), attention.wk and
    attention.wv (n_kv_heads·h, dim), attention.wo (dim, n_heads·h), feed_forward.w1 and w3 (ffn_dim, dim),
    feed_forward.w2 (dim, ffn_dim), attention_norm and ffn_norm (dim,); then norm (dim,) and output (vocab, dim).
    The layout, applied in this order (as torchtitan's parallelize_llama):
    - pipeline, pp stages: stage s holds layers s·L/pp .. (s+1)·L/pp - 1 (L = n_layers); the first stage also
      tok_embeddings, the last also norm and output (with pp = 1 one stage holds everything);
    - tensor parallelism, tp GPUs: wq, wk, wv, w1 and w3 split on dim 0 (column-wise), wo and w2 on dim 1
      (row-wise), tok_embeddings and output on dim 0 (their vocab rows) into tp equal parts; the norms are not
      split (every TP rank holds them whole);
    - FSDP (FSDP2's fully_shard), fsdp GPUs: every tensor a GPU holds after that is split on dim 0 into fsdp
      shards, padded: each GPU allocates ceil(rows / fsdp) rows (a 1-d norm: ceil(dim / fsdp) elements).
    With N the elements one GPU of the stage then holds, mixed-precision AdamW keeps 2N bytes of bf16 parameters,
    2N of bf16 gradients and 12N of optimizer state (the fp32 master weights and AdamW's two fp32 moments); every
    GPU of a stage holds the same. Return {"params": 2N, "grads": 2N, "optimizer": 12N, "total": 16N}, Python ints
    (activations and buffers are not model state: not counted).
    Every count (the fields of model and layout) may be an int, a numpy integer or an integral float (4096.0); the
    stage is an int, 0 .. pp - 1. Raise ValueError, naming what to change (before any other name) and saying what
    to pass, unless every count is a whole number 1 or more, n_heads divides dim, n_kv_heads divides n_heads, tp
    divides n_kv_heads, ffn_dim and vocab, pp divides n_layers and stage is one of the stages.
    """
    raise NotImplementedError('whole numbers checked; the divisibility; then each tensor of the stage: its shape, cut by TP (dim 0 or 1, or not), then ceil(rows / fsdp) rows; N = the sum of their elements')


def _whole(name: str, value: Any) -> int:
    """value as an int if it is a whole number 1 or more (an int, a numpy integer, an integral float), else a
    ValueError naming it."""
    raise NotImplementedError('refuse bool; an Integral as it is; a finite integral float by int(); then at least 1')
