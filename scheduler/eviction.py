"""Eviction score: which KV blocks to free first.

``score = α·reuse − β·size − γ·age + δ·soon`` (AAFLOW+'s eviction utility, plus a KVFlow-style
"steps until next use" term from the workflow being executed): blocks with the *lowest*
score are evicted first. ``reuse`` is the hit count, ``size`` is in MiB, ``age`` is seconds
since last use, and ``soon = 1 / (1 + steps_until_next_use)`` (0 when the running workflow will
not use the block again), so a block needed two steps from now outranks an idle one.
All inputs are numpy arrays of equal length; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["EvictionWeights", "eviction_order", "eviction_scores"]


@dataclass(frozen=True, slots=True)
class EvictionWeights:
    alpha_reuse: float = 1.0
    beta_size_per_mib: float = 0.1
    gamma_age_per_s: float = 0.01
    delta_next_use: float = 100.0

    def __post_init__(self) -> None:
        if min(self.alpha_reuse, self.beta_size_per_mib, self.gamma_age_per_s, self.delta_next_use) < 0:
            raise ValueError(f"eviction weights must be non-negative, got {self}")


def eviction_scores(
    hits: np.ndarray,
    nbytes: np.ndarray,
    age_s: np.ndarray,
    steps_until_next_use: np.ndarray | None = None,
    weights: EvictionWeights | None = None,
) -> np.ndarray:
    """Per-block scores (float64); ``steps_until_next_use`` < 0 means "not needed again"."""
    w = weights or EvictionWeights()
    score = w.alpha_reuse * hits.astype(np.float64)
    score -= w.beta_size_per_mib * nbytes.astype(np.float64) / (1 << 20)
    score -= w.gamma_age_per_s * np.maximum(age_s.astype(np.float64), 0.0)
    if steps_until_next_use is not None:
        steps = steps_until_next_use.astype(np.float64)
        score += w.delta_next_use * np.where(steps >= 0, 1.0 / (1.0 + np.maximum(steps, 0.0)), 0.0)
    return score


def eviction_order(scores: np.ndarray, evictable: np.ndarray) -> np.ndarray:
    """Indices of evictable blocks, lowest score first (ties: lower index first)."""
    idx = np.flatnonzero(evictable)
    return idx[np.argsort(scores[idx], kind="stable")]
