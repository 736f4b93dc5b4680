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
    # BEGIN SOLUTION: check the inputs before any message; then the n blocks: post the pass's isend to r+1 and irecv from r-1 (k and v), fold the held block (skip a later rank's under causal, mask the own block's upper triangle), wait, hold what arrived; o / l, cast back
    _check_attention_inputs(q, k, v)
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    accumulate = torch.promote_types(q.dtype, torch.float32)
    batch, heads, chunk, head_dim = q.shape
    scaled_q = q.to(accumulate) * (1.0 / math.sqrt(head_dim))
    running_max = torch.full((batch, heads, chunk, 1), -math.inf, dtype=accumulate, device=q.device)
    total = torch.zeros((batch, heads, chunk, 1), dtype=accumulate, device=q.device)
    out = torch.zeros((batch, heads, chunk, v.shape[-1]), dtype=accumulate, device=q.device)
    held = (k.contiguous(), v.contiguous())
    for step in range(n):
        source = (rank - step) % n
        pending, arriving = [], None
        if step < n - 1:
            arriving = (torch.empty_like(held[0]), torch.empty_like(held[1]))
            ops = [dist.P2POp(dist.isend, tensor, group=group, group_peer=(rank + 1) % n) for tensor in held]
            ops += [dist.P2POp(dist.irecv, tensor, group=group, group_peer=(rank - 1) % n) for tensor in arriving]
            pending = dist.batch_isend_irecv(ops)
        if not (causal and source > rank):
            scores = scaled_q @ held[0].to(accumulate).transpose(-2, -1)  # (batch, heads, c, c)
            if causal and source == rank:
                above = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
                scores = scores.masked_fill(above, -math.inf)
            new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
            rescale = torch.exp(running_max - new_max)
            weights = torch.exp(scores - new_max)
            total = total * rescale + weights.sum(dim=-1, keepdim=True)
            out = out * rescale + weights @ held[1].to(accumulate)
            running_max = new_max
        for work in pending:
            work.wait()
        if arriving is not None:
            held = arriving
    return (out / total).to(q.dtype)
    # END SOLUTION


def _check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """ValueError, naming the argument, unless q, k and v are 4-d floating tensors of one shape, dtype and device."""
    # BEGIN SOLUTION: each is a tensor, 4-d and floating; k and v like q in shape, dtype and device
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4 or not tensor.is_floating_point():
            what = f"a {tensor.dim()}-d {tensor.dtype} tensor" if isinstance(tensor, torch.Tensor) else repr(tensor)
            raise ValueError(f"{name} is {what}: pass a floating tensor shaped (batch, heads, chunk, head_dim)")
    for name, tensor in (("k", k), ("v", v)):
        if tensor.shape != q.shape or tensor.dtype != q.dtype or tensor.device != q.device:
            raise ValueError(f"{name} is {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}, q is "
                             f"{tuple(q.shape)} {q.dtype} on {q.device}: pass q, k and v of the same shape, dtype "
                             "and device (this rank's chunk of each)")
    # END SOLUTION


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
    # BEGIN SOLUTION: check everything; keep each expert's first `capacity` assignments (cumulative count per expert in flat t*k+j order); sort the kept ones by expert (stable); all_to_all_single the per-expert counts, then the rows with uneven splits; reorder what arrived by (local expert, source)
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    _check_routing(x, expert_ids, gates, n_experts, capacity, ep)
    tokens, k = expert_ids.shape
    local = n_experts // ep
    flat = expert_ids.reshape(-1).long()
    one_hot = torch.nn.functional.one_hot(flat, n_experts)  # (T * k, E)
    place = (one_hot.cumsum(0) * one_hot).sum(1) - 1  # each assignment's place in its expert's queue
    kept = place < capacity
    order = torch.nonzero(kept).flatten()
    order = order[torch.sort(flat[order], stable=True).indices]
    counts = torch.bincount(flat[order], minlength=n_experts)  # rows sent to each expert
    send_splits = counts.reshape(ep, local).sum(1).tolist()
    arrived_counts = torch.empty_like(counts)
    dist.all_to_all_single(arrived_counts, counts, group=group)  # (ep sources x local experts)
    arrived_counts = arrived_counts.reshape(ep, local)
    recv_splits = arrived_counts.sum(1).tolist()
    arrived = x.new_empty((sum(recv_splits), x.shape[1]))
    dist.all_to_all_single(arrived, x[order // k].contiguous(), output_split_sizes=recv_splits,
                           input_split_sizes=send_splits, group=group)
    expert_of_row = torch.repeat_interleave(torch.arange(local).repeat(ep), arrived_counts.reshape(-1))
    regroup = torch.sort(expert_of_row, stable=True).indices
    plan = DispatchPlan(kept.reshape(tokens, k), order, send_splits, recv_splits, regroup, gates)
    return arrived[regroup], arrived_counts.sum(0).tolist(), plan
    # END SOLUTION


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
    # BEGIN SOLUTION: check the rows; undo the regrouping; all_to_all_single back with the splits swapped; weigh each returned row by its gate and index_add it into its token's row
    received = sum(plan.recv_splits)
    if not isinstance(expert_out, torch.Tensor) or expert_out.dim() != 2 or expert_out.shape[0] != received:
        what = tuple(expert_out.shape) if isinstance(expert_out, torch.Tensor) else repr(expert_out)
        raise ValueError(f"expert_out is {what}: pass one output row per row moe_dispatch returned, ({received}, "
                         "dim_out)")
    arrived = torch.empty_like(expert_out)
    arrived[plan.regroup] = expert_out
    back = expert_out.new_empty((len(plan.order), expert_out.shape[1]))
    dist.all_to_all_single(back, arrived, output_split_sizes=plan.send_splits, input_split_sizes=plan.recv_splits,
                           group=group)
    tokens, k = plan.kept.shape
    weights = plan.gates.reshape(-1)[plan.order].to(expert_out.dtype)
    out = expert_out.new_zeros((tokens, expert_out.shape[1]))
    return out.index_add_(0, plan.order // k, back * weights[:, None])
    # END SOLUTION


def _check_routing(x: torch.Tensor, expert_ids: torch.Tensor, gates: torch.Tensor, n_experts: Any, capacity: Any,
                   ep: int) -> None:
    """ValueError, naming the argument, for anything moe_dispatch's docstring refuses (no communication)."""
    # BEGIN SOLUTION: x 2-d floating; expert_ids (T, k) integer, k >= 1, values in range, distinct per row; gates floating of expert_ids' shape; n_experts a whole multiple of ep; capacity a whole number >= 0
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x is {_describe(x)}: pass this rank's tokens, a floating tensor shaped (T, dim)")
    if (not isinstance(n_experts, numbers.Integral) or isinstance(n_experts, bool) or n_experts < 1
            or n_experts % ep):
        raise ValueError(f"n_experts is {n_experts!r}: pass a whole number of experts that the group's {ep} ranks "
                         "share evenly (a multiple of the group's size)")
    if not isinstance(capacity, numbers.Integral) or isinstance(capacity, bool) or capacity < 0:
        raise ValueError(f"capacity is {capacity!r}: pass a whole number of assignments per expert, 0 or more")
    if (not isinstance(expert_ids, torch.Tensor) or expert_ids.dim() != 2 or expert_ids.is_floating_point()
            or expert_ids.dtype == torch.bool or expert_ids.shape[0] != x.shape[0] or expert_ids.shape[1] < 1):
        raise ValueError(f"expert_ids is {_describe(expert_ids)}: pass an integer tensor shaped (T, k), k >= 1, "
                         f"with T = {x.shape[0]} as x")
    if expert_ids.numel() and (int(expert_ids.min()) < 0 or int(expert_ids.max()) >= n_experts):
        raise ValueError(f"expert_ids holds experts outside 0 .. {n_experts - 1}: pass experts of the n_experts")
    ordered = expert_ids.sort(dim=1).values
    if bool((ordered[:, 1:] == ordered[:, :-1]).any()):
        raise ValueError("expert_ids names an expert twice for one token: pass k distinct experts per token")
    if not isinstance(gates, torch.Tensor) or gates.shape != expert_ids.shape or not gates.is_floating_point():
        raise ValueError(f"gates is {_describe(gates)}: pass a floating tensor shaped like expert_ids, "
                         f"{tuple(expert_ids.shape)}")
    # END SOLUTION


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
    # BEGIN SOLUTION: whole numbers checked; the divisibility; then each tensor of the stage: its shape, cut by TP (dim 0 or 1, or not), then ceil(rows / fsdp) rows; N = the sum of their elements
    vocab, dim, layers, heads, kv_heads, ffn = (_whole(f"model.{name}", value)
                                                for name, value in zip(LlamaShape._fields, model))
    fsdp, tp, pp = (_whole(f"layout.{name}", value) for name, value in zip(Layout._fields, layout))
    if dim % heads:
        raise ValueError(f"model.n_heads={heads} does not divide model.dim={dim}: pass heads of a whole width")
    if heads % kv_heads:
        raise ValueError(f"model.n_kv_heads={kv_heads} does not divide model.n_heads={heads}: pass a divisor")
    for name, size in (("n_kv_heads", kv_heads), ("ffn_dim", ffn), ("vocab", vocab)):
        if size % tp:
            raise ValueError(f"layout.tp={tp} does not divide model.{name}={size}: pass a tp that divides "
                             f"n_kv_heads={kv_heads}, ffn_dim={ffn} and vocab={vocab}")
    if layers % pp:
        raise ValueError(f"layout.pp={pp} does not divide model.n_layers={layers}: pass a pp that divides it")
    if isinstance(stage, bool) or not isinstance(stage, numbers.Integral) or not 0 <= stage < pp:
        raise ValueError(f"stage is {stage!r}: pass an int, one of the stages 0 .. {pp - 1}")
    h = dim // heads

    def held(rows: int, columns: int = 1, split_rows: bool = False, split_columns: bool = False) -> int:
        rows, columns = rows // tp if split_rows else rows, columns // tp if split_columns else columns
        return -(-rows // fsdp) * columns

    layer = (held(heads * h, dim, split_rows=True) + 2 * held(kv_heads * h, dim, split_rows=True)
             + held(dim, heads * h, split_columns=True) + 2 * held(ffn, dim, split_rows=True)
             + held(dim, ffn, split_columns=True) + 2 * held(dim))
    elements = layers // pp * layer
    if stage == 0:
        elements += held(vocab, dim, split_rows=True)
    if stage == pp - 1:
        elements += held(dim) + held(vocab, dim, split_rows=True)
    parts = {name: size * elements for name, size in BYTES_PER_ELEMENT.items()}
    return {**parts, "total": sum(parts.values())}
    # END SOLUTION


def _whole(name: str, value: Any) -> int:
    """value as an int if it is a whole number 1 or more (an int, a numpy integer, an integral float), else a
    ValueError naming it."""
    # BEGIN SOLUTION: refuse bool; an Integral as it is; a finite integral float by int(); then at least 1
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        whole = int(value)
    elif (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
          and float(value).is_integer()):
        whole = int(value)
    else:
        whole = None
    if whole is None or whole < 1:
        raise ValueError(f"{name} is {value!r}: pass a whole number (an int, or an integral float such as 4096.0), "
                         "1 or more")
    return whole
    # END SOLUTION
