"""Stateful template KV: the exact KV, the template prefilled after its prefix (every token
recomputed; what per-workflow caching holds)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from graphflow.kv.differential.methods import Rebuilt
from graphflow.kv.differential.paths import PathKey
from graphflow.kv.packing import cache_from_tensor, stack_cache
from graphflow.kv.prefiller import Prefiller

__all__ = ["Stateful"]


@dataclass(frozen=True, slots=True)
class Stateful:
    @property
    def label(self) -> str:
        return "stateful"

    @torch.inference_mode()
    def rebuild(
        self, engine: Prefiller, key: PathKey, prefix_kv: torch.Tensor, template: Sequence[int]
    ) -> Rebuilt | None:
        p = prefix_kv.shape[3]
        out = engine.prefill(list(template), cache_from_tensor(prefix_kv, engine.config, prefix_kv.device))
        return Rebuilt(stack_cache(out.cache, p).float(), len(template))
