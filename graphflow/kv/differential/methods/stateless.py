"""Stateless template KV: the prefix-free base re-rotated to the template's offset; no token is
recomputed and no residual is held."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from graphflow.kv.differential.methods import Rebuilt, moved_base
from graphflow.kv.differential.paths import PathKey
from graphflow.kv.differential.store import DifferentialKV
from graphflow.kv.prefiller import Prefiller

__all__ = ["Stateless"]


@dataclass(frozen=True, slots=True)
class Stateless:
    store: DifferentialKV

    @property
    def label(self) -> str:
        return "stateless"

    def rebuild(
        self, engine: Prefiller, key: PathKey, prefix_kv: torch.Tensor, template: Sequence[int]
    ) -> Rebuilt | None:
        kv = moved_base(self.store, key, prefix_kv.shape[3])
        return None if kv is None else Rebuilt(kv, 0)
