"""One forward pass over several requests of different lengths (ragged batching).

Each :class:`Row` brings the tokens it adds this step, its own cache (a transformers
``DynamicCache``, extended in place; the engine loop's are
:class:`~graphflow.models.row_cache.RowCache`, with their room reserved) and, optionally, a
:class:`SharedPrefix`: KV that several rows continue (agents fanning out from one context),
held once for all of them. The linear layers (projections, MLP, norms) run once over every
row's tokens packed into one sequence;
attention runs per row over ``[shared prefix | own cache]``, split in two parts whose results
are merged by their log-sum-exp (as cascade / shared-prefix attention kernels do). Rows that
continue one prefix attend over it in a single call with their queries stacked, so the prefix
is read once per layer per step, never copied per row.

Llama-family decoders (``llama``, ``qwen2`` without sliding windows) are supported: the
forward reuses the model's own modules (embeddings, rotary embedding, projections, norms,
MLP, head), so weights, RoPE scaling and biases are the model's. :func:`unsupported` says why
another model cannot be batched this way (the engine then runs requests one at a time).

Packing changes the shapes the matrix multiplies see, so float rounding can differ from a
request run alone: greedy tokens match (asserted in tests), logits agree within ~1e-4
relative to their scale for fp32 (``tests/unit/models/test_ragged.py``).

The MLP and the head run over a step's tokens padded with zero rows where the engine loop
measured that a few more rows cost less on its host (:mod:`graphflow.models.gemm_padding`: a
CPU BLAS takes a slower sgemm path at some small row counts); padding changes rounding only as
packing already does.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from graphflow.kv.packing import cache_length
from graphflow.models.gemm_padding import GemmPadding
from graphflow.models.prefix_kernel import MAX_QUERIES, prefix_kernel
from graphflow.models.scratch import ScratchBuffer

if TYPE_CHECKING:
    from transformers import DynamicCache

__all__ = ["GemmPadding", "Row", "SharedPrefix", "attend", "forward_layers", "forward_rows", "unsupported"]

_ARCHS = ("llama", "qwen2")


def _padded(fn: Any, x: torch.Tensor, padding: GemmPadding | None) -> torch.Tensor:
    """``fn`` over the rows of ``x`` (dim -2), padded with zero rows as ``padding`` says."""
    n = x.shape[-2]
    rows = padding.rows(n) if padding is not None else n
    if rows == n:
        return fn(x)
    zeros = x.new_zeros((*x.shape[:-2], rows - n, x.shape[-1]))
    return fn(torch.cat([x, zeros], dim=-2)).narrow(-2, 0, n)


class SharedPrefix:
    """KV of a prefix several rows continue, held once: a chain of parts, each
    ``[layers, 2, kv_heads, tokens, head_dim]``, in token order.

    On the CPU the parts are the stored blocks themselves, not a copy. :meth:`attend` reads a
    few queries' attention (a decode step's) from them in place with the kernel of
    :mod:`~graphflow.models.prefix_kernel` where it is built and takes the blocks. Otherwise, and
    for many queries (a prefill chunk), :meth:`layer` gathers one
    layer's keys and values into its thread's gather buffer, one for every prefix the thread
    gathers (the engine loop's: the rows attend each layer right after it is gathered), of the
    largest layer gathered so far, so prefixes read at once cost one layer of the longest on
    top of the blocks the store already holds, kept from one step and request to the next. The
    gather is a memory-bound copy that leaves the layer in cache for the attention reading it
    next. Elsewhere (a GPU engine over host-held blocks) the parts are joined into one copy on
    the device once, and :meth:`layer` returns views of it.
    """

    def __init__(
        self, parts: Sequence[torch.Tensor], device: str | torch.device = "cpu", in_place: bool = True
    ) -> None:
        if not parts:
            raise ValueError("a shared prefix needs at least one part")
        shape = parts[0].shape
        if any(p.dim() != 5 or p.shape[:3] != shape[:3] or p.shape[4] != shape[4] for p in parts):
            raise ValueError("a shared prefix's parts must all be [layers, 2, kv_heads, tokens, head_dim] of one model")
        device = torch.device(device)
        if device.type != "cpu" or any(p.device != device for p in parts):
            parts = [torch.cat(list(parts), dim=3).to(device)]
        self.parts = list(parts)
        self.tokens = sum(int(p.shape[3]) for p in parts)
        self.layers = int(shape[0])
        # NOTE: each layer's views of the parts, made once: building them per step cost as much
        # as the gather itself (256 blocks × 30 layers of SmolLM2 at 4K tokens)
        self._views = [[p[i] for p in self.parts] for i in range(self.layers)] if len(self.parts) > 1 else []
        # the in-place kernel's description of the blocks (None: every layer is gathered for flash)
        self._blocks = prefix_kernel().blocks(self.parts) if in_place and len(self.parts) > 1 else None

    @property
    def in_place(self) -> bool:
        """Whether few queries attend over the blocks in place (:mod:`~graphflow.models.prefix_kernel`)."""
        return self._blocks is not None

    def attend(self, index: int, q: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of ``q`` ``[1, heads, t, head_dim]`` over every token of layer ``index``,
        and its log-sum-exp ``[1, heads, t]`` (as :func:`attend` with ``causal=False``)."""
        _, heads, t, d = q.shape
        kv_heads = int(self.parts[0].shape[2])
        queries = heads // kv_heads * t
        if self._blocks is None or queries > MAX_QUERIES:
            keys, values = self.layer(index)
            return attend(q, keys, values, scale, causal=False)
        out, lse = prefix_kernel().attend(q.reshape(kv_heads, queries, d).contiguous(), self._blocks, index, scale)
        return out.view(1, heads, t, d), lse.view(1, heads, t)

    @classmethod
    def from_tensor(cls, kv: torch.Tensor, device: str | torch.device = "cpu") -> SharedPrefix:
        """From one ``[layers, 2, kv_heads, tokens, head_dim]`` tensor (held as it is)."""
        return cls([kv], device)

    @torch.inference_mode()
    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s keys and values, each ``[1, kv_heads, tokens, head_dim]``; a
        gathered layer stays valid until this thread's next gather (of any prefix)."""
        if len(self.parts) == 1:
            kv = self.parts[0][index]
        else:
            first = self.parts[0]
            out = _gather_buffer((2, int(first.shape[2]), self.tokens, int(first.shape[4])), first)
            kv = torch.cat(self._views[index], dim=2, out=out)
        return kv[0].unsqueeze(0), kv[1].unsqueeze(0)

    @property
    def nbytes(self) -> int:
        """Bytes this prefix adds to what its parts' owner holds: the device copy (a gathered
        prefix adds none of its own: its thread's gather buffer serves every prefix)."""
        if len(self.parts) > 1:
            return 0
        return self.parts[0].numel() * self.parts[0].element_size()


_GATHER = threading.local()  # NOTE: per thread, so a gather is never overwritten before its attention reads it


def _gather_buffer(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """This thread's gather buffer as a contiguous tensor of ``shape`` (``like``'s dtype and
    device), grown when a larger layer is gathered."""
    scratch: ScratchBuffer | None = getattr(_GATHER, "scratch", None)
    if scratch is None:
        scratch = _GATHER.scratch = ScratchBuffer()
    return scratch.view(shape, like)


@dataclass(eq=False)
class Row:
    """One request's part of a step: ``tokens`` to run after ``shared`` + ``cache``."""

    tokens: Sequence[int]
    cache: DynamicCache
    shared: SharedPrefix | None = None
    logits: bool = True  # return the last token's logits (a prefill chunk that does not end needs none)

    @property
    def past(self) -> int:
        return (self.shared.tokens if self.shared else 0) + cache_length(self.cache)


def unsupported(model: Any) -> str:
    """Why ``model`` cannot run :func:`forward_rows` ("" when it can)."""
    config = model.config
    if config.model_type not in _ARCHS:
        return f"ragged batching supports {', '.join(_ARCHS)} models, not {config.model_type}"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return "ragged batching needs full attention in every layer (this model uses sliding windows)"
    return ""


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` ``[1, heads, t, d]`` over ``k``/``v`` ``[1, kv_heads, s, d]``, and the
    log-sum-exp of its scores ``[1, heads, t]`` (float32).

    ``causal``: query ``i`` sees keys up to ``s - t + i`` (the queries are the last ``t``
    positions of the keys); else every key. A causal call is split into the keys before the
    queries (seen by all) and the ``t × t`` square (causal), merged by log-sum-exp, so no mask
    is built. Grouped-query heads are folded into the query dimension where every key is seen,
    so the keys are never repeated per head there.
    """
    t, s = q.shape[2], k.shape[2]
    if not causal or t == 1:
        return _attend_all(q, k, v, scale)
    group = q.shape[1] // k.shape[1]
    square_k = k[:, :, s - t :].repeat_interleave(group, dim=1)
    square_v = v[:, :, s - t :].repeat_interleave(group, dim=1)
    square = _flash(q, square_k, square_v, scale, causal=True)
    return square if s == t else _merge_pair(_attend_all(q, k[:, :, : s - t], v[:, :, : s - t], scale), square)


def _attend_all(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Every query over every key, grouped-query heads folded into the query dimension."""
    _, heads, t, d = q.shape
    kv_heads = k.shape[1]
    out, lse = _flash(q.reshape(1, kv_heads, heads // kv_heads * t, d), k, v, scale, causal=False)
    return out.reshape(1, heads, t, d), lse.reshape(1, heads, t)


def _flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, float32 log-sum-exp) with the CPU flash kernel, or plain matrix multiplies
    elsewhere; ``causal`` (top-left aligned) only for square problems."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        return out, lse.float()
    mask = None
    if causal:
        t = q.shape[2]
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril_().logical_not_()
    return _attend_matmul(q, k, v, scale, mask)


def _merge_pair(
    a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    total = torch.logaddexp(a[1], b[1])
    out = a[0].float() * torch.exp(a[1] - total).unsqueeze(-1) + b[0].float() * torch.exp(b[1] - total).unsqueeze(-1)
    return out.to(a[0].dtype), total


def _attend_matmul(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, masked: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention by plain matrix multiplies in float32 (``masked``: ``True`` where a query must
    not see a key)."""
    scores = torch.matmul(q.float(), k.float().transpose(2, 3)) * scale
    if masked is not None:
        scores = scores.masked_fill(masked, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    return torch.matmul(probs, v.float()).to(q.dtype), lse


def merge(parts: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Attention over the union of disjoint key sets, from each part's (output, log-sum-exp)."""
    merged = parts[0]
    for part in parts[1:]:
        merged = _merge_pair(merged, part)
    return merged[0]


def _prefix_groups(
    rows: Sequence[Row], bounds: Sequence[int], device: torch.device
) -> list[tuple[SharedPrefix, torch.Tensor]]:
    """Each shared prefix of ``rows`` with the packed positions of the tokens continuing it
    (its rows' tokens, in row order)."""
    groups: dict[int, tuple[SharedPrefix, list[int]]] = {}
    for i, r in enumerate(rows):
        if r.shared is not None:
            groups.setdefault(id(r.shared), (r.shared, []))[1].extend(range(bounds[i], bounds[i + 1]))
    return [(prefix, torch.tensor(at, dtype=torch.long, device=device)) for prefix, at in groups.values()]


@torch.inference_mode()
def forward_rows(model: Any, rows: Sequence[Row], padding: GemmPadding | None = None) -> list[torch.Tensor | None]:
    """One forward over ``rows`` (see the module docstring): each row's cache grows by its
    tokens; returns each row's last-token logits ``[vocab]`` (float32), ``None`` where the row
    asked for none. ``padding``: the rows the MLP and the head run over (``None``: unpadded)."""
    layers = forward_layers(model, rows, padding)
    while True:
        try:
            next(layers)
        except StopIteration as done:
            return done.value


@torch.inference_mode()
def forward_layers(
    model: Any, rows: Sequence[Row], padding: GemmPadding | None = None
) -> Generator[int, None, list[torch.Tensor | None]]:
    """:func:`forward_rows`, one decoder layer per ``next()``: yields each layer's index once
    that layer is done, and returns the logits. Between two layers the caller may run other
    forwards over other rows (the engine loop pauses a long chunk so a short prefill that
    arrived meanwhile need not wait for it): nothing is held across a yield but this forward's
    own hidden states, and each row's cache is complete up to the layer yielded."""
    # NOTE: imported here: the modeling module takes ~1.5 s to import, which a process that only
    # names the replica class (a Ray client, Ray's client server) need not pay
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    why = unsupported(model)
    if why:
        raise ValueError(why)
    if not rows or any(not r.tokens for r in rows):
        raise ValueError("forward_rows needs one or more rows, each with at least one token")
    base, device = model.model, model.lm_head.weight.device
    lengths = [len(r.tokens) for r in rows]
    bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    ids = torch.tensor([t for r in rows for t in r.tokens], dtype=torch.long, device=device)[None]
    positions = torch.cat([torch.arange(r.past, r.past + n, device=device) for r, n in zip(rows, lengths, strict=True)])
    hidden = base.embed_tokens(ids)
    cos, sin = base.rotary_emb(hidden, positions[None])
    prefixes = _prefix_groups(rows, bounds, device)
    # NOTE: the packed positions of every token that continues a prefix, in the order the
    # prefixes' outputs are joined below: their merge with the rows' own parts is one for all
    continuing = torch.cat([at for _, at in prefixes]) if prefixes else None
    for layer_idx, layer in enumerate(base.layers[: model.config.num_hidden_layers]):
        attn = layer.self_attn
        h = layer.input_layernorm(hidden)
        q = attn.q_proj(h).view(1, -1, model.config.num_attention_heads, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(1, -1, model.config.num_key_value_heads, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(1, -1, model.config.num_key_value_heads, attn.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        own = []  # each row over its own cache
        for i, r in enumerate(rows):
            a, b = bounds[i], bounds[i + 1]
            keys, values = r.cache.update(k[:, :, a:b], v[:, :, a:b], layer_idx)
            own.append(attend(q[:, :, a:b], keys, values, attn.scaling, causal=True))
        out = torch.cat([o for o, _ in own], dim=2)
        if continuing is not None:  # the shared prefixes: each once for every row continuing it
            shared = []
            for prefix, at in prefixes:
                shared.append(prefix.attend(layer_idx, q.index_select(2, at), attn.scaling))
            lse = torch.cat([s for _, s in own], dim=2)
            merged = merge(
                [
                    (torch.cat([o for o, _ in shared], dim=2), torch.cat([s for _, s in shared], dim=2)),
                    (out.index_select(2, continuing), lse.index_select(2, continuing)),
                ]
            )
            out = out.index_copy(2, continuing, merged)
        mixed = out.transpose(1, 2).reshape(1, ids.shape[1], -1)
        hidden = hidden + attn.o_proj(mixed)
        hidden = hidden + _padded(layer.mlp, layer.post_attention_layernorm(hidden), padding)
        yield layer_idx
    wanted = [i for i, r in enumerate(rows) if r.logits]
    result: list[torch.Tensor | None] = [None] * len(rows)
    if wanted:
        last = base.norm(hidden[0, [bounds[i + 1] - 1 for i in wanted]])
        logits = _padded(model.lm_head, last, padding).float()
        for j, i in enumerate(wanted):
            result[i] = logits[j]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result
