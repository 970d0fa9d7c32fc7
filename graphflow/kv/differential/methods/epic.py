"""EPIC-style template KV: the re-rotated base with the template's first k tokens recomputed
after the prefix (EPIC recomputes the first tokens of each reused chunk, which attend to the
new prefix and repair the attention sink the base was computed with). ``k`` is a token count
(``tokens``) or a fraction of each template's tokens, rounded down (``fraction``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from graphflow.kv.differential.codecs import fraction_of
from graphflow.kv.differential.methods import Rebuilt, moved_base
from graphflow.kv.differential.paths import PathKey
from graphflow.kv.differential.recompute import recompute_tokens
from graphflow.kv.differential.store import DifferentialKV
from graphflow.kv.prefiller import Prefiller

__all__ = ["Epic"]


@dataclass(frozen=True, slots=True)
class Epic:
    store: DifferentialKV
    tokens: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        if (self.tokens is None) == (self.fraction is None):
            raise ValueError("give EPIC exactly one of tokens or fraction")
        if self.tokens is not None and self.tokens < 0:
            raise ValueError(f"EPIC's k must be non-negative, got {self.tokens}")
        if self.fraction is not None and not 0 <= self.fraction <= 1:
            raise ValueError(f"EPIC's fraction must lie in [0, 1], got {self.fraction}")

    @property
    def label(self) -> str:
        return f"epic-{self.tokens}" if self.tokens is not None else f"epic-{self.fraction:.0%}"

    def head(self, n: int) -> int:
        if self.tokens is not None:
            return min(n, self.tokens)
        assert self.fraction is not None
        return fraction_of(self.fraction, n)

    def rebuild(
        self, engine: Prefiller, key: PathKey, prefix_kv: torch.Tensor, template: Sequence[int]
    ) -> Rebuilt | None:
        kv = moved_base(self.store, key, prefix_kv.shape[3])
        if kv is None:
            return None
        k = self.head(len(template))
        return Rebuilt(recompute_tokens(engine, prefix_kv, kv, template, range(k)), k)
