"""Differential KV's base (GraphFlow): an operation's template KV with no prefix, and the dense
residual an exact execution after a prefix differs from it by.

* ``base(v)``: the KV of operation v's template tokens computed with no prefix, at positions
  ``[0, n_v)``.
* ``residual(P, v) = KV_exact(v | P) − rerotate(base(v), |P|)``: what the prefix P changes
  beyond moving the keys to their positions (values are not rotated).

Tensors are ``[layers, 2, kv_heads, tokens, head_dim]`` like a block (K at index 0, V at 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from graphflow.kv.packing import stack_cache
from graphflow.kv.prefiller import Prefiller
from graphflow.kv.rope import rerotate_keys
from graphflow.kv.state import RopeInfo

__all__ = ["base_kv", "rerotate_kv", "residual", "template_kv"]


@torch.inference_mode()
def template_kv(engine: Prefiller, template_ids: Sequence[int], prefix_ids: Sequence[int] = ()) -> torch.Tensor:
    """KV of ``template_ids`` computed after ``prefix_ids`` (exact), template tokens only."""
    if not template_ids:
        raise ValueError("the template has no tokens")
    cache = engine.prefill(list(prefix_ids)).cache if prefix_ids else None
    out = engine.prefill(list(template_ids), cache)
    return stack_cache(out.cache, len(prefix_ids)).float()


def base_kv(engine: Prefiller, template_ids: Sequence[int]) -> torch.Tensor:
    """``base(v)``: the template's KV with no prefix, positions ``[0, n_v)``."""
    return template_kv(engine, template_ids)


def rerotate_kv(kv: torch.Tensor, offset: int, rope: RopeInfo) -> torch.Tensor:
    """Move a KV tensor by ``offset`` positions: keys re-rotated, values unchanged."""
    return torch.stack((rerotate_keys(kv[:, 0], offset, rope), kv[:, 1]), dim=1)


def residual(exact: torch.Tensor, base: torch.Tensor, offset: int, rope: RopeInfo | None) -> torch.Tensor:
    """Dense ΔKV = exact − (re-rotated) base; ``rope=None`` skips re-rotation (the ablation)."""
    if exact.shape != base.shape:
        raise ValueError(f"exact {tuple(exact.shape)} and base {tuple(base.shape)} KV differ in shape")
    moved = rerotate_kv(base, offset, rope) if rope is not None else base
    return exact - moved
