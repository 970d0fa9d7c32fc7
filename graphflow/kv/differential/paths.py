"""Prefix-path statistics and pruning for differential KV.

A *path key* is ``(P, v)``: the roles whose outputs precede operation ``v``'s template in its
prompt (``P``, possibly empty) and ``v`` itself. Executed workflows are counted per path key;
residuals are materialized only for the hot ones, and cold ones fall back to recompute.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["PathKey", "PathStats"]


@dataclass(frozen=True, slots=True, order=True)
class PathKey:
    path: tuple[str, ...]
    op: str

    def __str__(self) -> str:
        return " → ".join((*self.path, self.op)) if self.path else f"(task) → {self.op}"


class PathStats:
    """Counts of executed path keys; picks the hot ones by frequency or rank."""

    def __init__(self) -> None:
        self.counts: Counter[PathKey] = Counter()

    def observe(self, keys: Iterable[PathKey]) -> None:
        """Count each key of one executed workflow."""
        self.counts.update(keys)

    def hot(self, min_count: int | None = None, top_k: int | None = None) -> set[PathKey]:
        """Keys seen at least ``min_count`` times, or the ``top_k`` most frequent (ties broken by
        key order, so the choice is deterministic). Exactly one of the two must be given."""
        if (min_count is None) == (top_k is None):
            raise ValueError("give exactly one of min_count or top_k")
        if min_count is not None:
            if min_count < 1:
                raise ValueError(f"min_count must be at least 1, got {min_count}")
            return {k for k, n in self.counts.items() if n >= min_count}
        assert top_k is not None
        if top_k < 0:
            raise ValueError(f"top_k must be non-negative, got {top_k}")
        ranked = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return {k for k, _ in ranked[:top_k]}
