"""Selective recompute: correct a rebuilt template KV by recomputing a few of its tokens.

A template KV rebuilt from base + residual (:mod:`graphflow.kv.differential.codecs`) is right on
average over the executions of a path but misses what *this* task's text adds to each token's
keys and values. Recomputing the whole template after the prefix removes the error and costs
a full template prefill. :func:`recompute_tokens` recomputes only the chosen template
positions, in one forward pass: each chosen token attends to the exact prefix, the rebuilt KV
of the unchosen template tokens before it, and the recomputed KV of the chosen tokens before
it (the idea of CacheBlend's selective recompute); the chosen positions' KV is replaced, the
rest is kept. With every position chosen the result equals a normal prefill of the template.

Which positions: the template's first ones (the codec's ``recompute_head``); in
``experiments/kv_memory`` recomputing them raised agreement, recomputing the last ones did not.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from graphflow.kv.differential.modes import KVMode
from graphflow.kv.differential.paths import PathKey
from graphflow.kv.differential.store import DifferentialKV
from graphflow.kv.packing import cache_from_tensor, stack_cache
from graphflow.kv.prefiller import Prefiller

__all__ = ["rebuild_template", "recompute_tokens"]


def _mask(prefix: int, n_template: int, chosen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[1, 1, k, prefix + n_template + k]`` additive mask for the chosen tokens' queries."""
    k = chosen.numel()
    t = torch.arange(n_template)
    old = (t[None, :] < chosen[:, None]) & ~torch.isin(t, chosen)[None, :]  # unchosen tokens before
    new = torch.arange(k)[None, :] <= torch.arange(k)[:, None]  # chosen tokens up to itself
    allowed = torch.cat((torch.ones(k, prefix, dtype=torch.bool), old, new), dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


@torch.inference_mode()
def recompute_tokens(
    engine: Prefiller,
    prefix_kv: torch.Tensor,
    template_kv: torch.Tensor,
    template: Sequence[int],
    positions: Sequence[int],
) -> torch.Tensor:
    """``template_kv`` (``[layers, 2, kv_heads, len(template), head_dim]``) with the KV of
    ``positions`` (template-relative) recomputed after ``prefix_kv``; other positions unchanged."""
    n = len(template)
    if template_kv.shape[3] != n:
        raise ValueError(f"template KV holds {template_kv.shape[3]} tokens but the template has {n}")
    chosen = torch.tensor(sorted(set(positions)), dtype=torch.long)
    if chosen.numel() == 0:
        return template_kv
    if int(chosen[0]) < 0 or int(chosen[-1]) >= n:
        raise ValueError(f"recompute positions must lie in [0, {n}), got {positions!r}")
    dtype = prefix_kv.dtype
    p = prefix_kv.shape[3]
    cache = cache_from_tensor(torch.cat((prefix_kv, template_kv.to(dtype)), dim=3), engine.config, prefix_kv.device)
    ids = torch.tensor([[template[int(i)] for i in chosen]], dtype=torch.long, device=prefix_kv.device)
    engine.model(
        input_ids=ids,
        cache=cache,
        use_cache=True,
        position_ids=(chosen + p)[None].to(prefix_kv.device),
        attention_mask=_mask(p, n, chosen, dtype).to(prefix_kv.device),
    )
    fresh = stack_cache(cache, p + n)
    out = template_kv.clone()
    out[:, :, :, chosen.to(out.device)] = fresh.to(out.dtype)
    return out


def rebuild_template(
    engine: Prefiller,
    store: DifferentialKV,
    key: PathKey,
    prefix_kv: torch.Tensor,
    template: Sequence[int],
    mode: KVMode = KVMode.DIFFERENTIAL,
) -> torch.Tensor | None:
    """The template KV of ``key`` after ``prefix_kv`` as ``mode`` serves it: base + residual,
    with the codec's ``recompute_head`` first tokens recomputed; ``None`` when the store has no
    state for it (recompute the template)."""
    kv = store.template_kv(key, prefix_kv.shape[3], mode)
    if kv is None:
        return None
    head = store.codec.head_tokens(len(template)) if mode is KVMode.DIFFERENTIAL else 0
    return recompute_tokens(engine, prefix_kv, kv, template, range(head))
