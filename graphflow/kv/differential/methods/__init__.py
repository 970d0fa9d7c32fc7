"""Ways to produce an operation template's KV after a new prefix, one module each, behind one
interface (:class:`TemplateMethod`), so the experiment and the replicas compare them alike:

* ``stateless`` — the template's base re-rotated to the offset, nothing recomputed;
* ``epic`` — the re-rotated base with the template's first k tokens recomputed (EPIC);
* ``cacheblend`` — the re-rotated base with the r% of tokens whose KV deviates most on an early
  layer recomputed (CacheBlend);
* ``ours`` — base + the hot path's residual, optionally with a recomputed head (GraphFlow);
* ``stateful`` — the exact KV, the template prefilled after the prefix.

Every method reports how many template tokens it computed through every layer after the
prefix (``Rebuilt.recomputed``); ``None`` means it has nothing for that template and the caller
prefills it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from graphflow.kv.differential.base import rerotate_kv
from graphflow.kv.differential.paths import PathKey
from graphflow.kv.differential.store import DifferentialKV
from graphflow.kv.prefiller import Prefiller

__all__ = ["Rebuilt", "TemplateMethod", "moved_base"]


@dataclass(frozen=True, slots=True, eq=False)
class Rebuilt:
    """A template's KV after its prefix, ``[layers, 2, kv_heads, tokens, head_dim]`` (float32),
    and how many of its tokens were computed through every layer to get it."""

    kv: torch.Tensor
    recomputed: int

    @property
    def recompute_fraction(self) -> float:
        return self.recomputed / self.kv.shape[3]


class TemplateMethod(Protocol):
    @property
    def label(self) -> str: ...

    def rebuild(
        self, engine: Prefiller, key: PathKey, prefix_kv: torch.Tensor, template: Sequence[int]
    ) -> Rebuilt | None: ...


def moved_base(store: DifferentialKV, key: PathKey, offset: int) -> torch.Tensor | None:
    """``key.op``'s base re-rotated to ``offset`` (float32), or ``None`` when it has no base."""
    base = store.bases.get(key.op)
    return None if base is None else rerotate_kv(base.kv.float(), offset, store.rope)
