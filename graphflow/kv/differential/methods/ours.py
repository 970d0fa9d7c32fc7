"""GraphFlow's differential template KV as a method: ``rerotate(base + Δ₀, offset)`` from the
hot path's residual, with the codec's head recomputed after the prefix
(:func:`graphflow.kv.differential.recompute.rebuild_template`); ``None`` on a cold path, which
is pruned and prefilled exactly."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from graphflow.kv.differential.methods import Rebuilt
from graphflow.kv.differential.paths import PathKey
from graphflow.kv.differential.recompute import rebuild_template
from graphflow.kv.differential.store import DifferentialKV
from graphflow.kv.prefiller import Prefiller

__all__ = ["Ours"]


@dataclass(frozen=True, slots=True)
class Ours:
    store: DifferentialKV

    @property
    def label(self) -> str:
        return f"ours ({self.store.codec.label})"

    def rebuild(
        self, engine: Prefiller, key: PathKey, prefix_kv: torch.Tensor, template: Sequence[int]
    ) -> Rebuilt | None:
        kv = rebuild_template(engine, self.store, key, prefix_kv, template)
        return None if kv is None else Rebuilt(kv, self.store.codec.head_tokens(len(template)))
