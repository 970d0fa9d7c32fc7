"""Which of a replica's block copies to evict to get under its byte budget, read off the catalog.

A pure function over :class:`~graphflow.kv.catalog.Catalog` columns: the replica's live copies
are scored by :func:`scheduler.eviction.eviction_scores` (hits, bytes, age, steps until the
running workflow needs a block) and taken lowest score first (deeper blocks first on ties)
until enough bytes are freed; pinned and leased copies are never chosen. It only plans: the
replica evicts and reports an ``EvictEvent``.
"""

from __future__ import annotations

import numpy as np

from graphflow.kv.catalog import Catalog
from graphflow.kv.events import EvictionPlan
from scheduler.eviction import EvictionWeights, eviction_order, eviction_scores

__all__ = ["plan_eviction"]


def plan_eviction(
    catalog: Catalog,
    replica: str,
    budget_bytes: int,
    now_s: float,
    weights: EvictionWeights,
    next_use: dict[int, int] | None = None,
) -> EvictionPlan:
    """The copies of ``replica`` to evict so it holds at most ``budget_bytes``; ``next_use`` maps
    block key → steps until the running workflow needs it. A plan whose ``shortfall_bytes`` is
    positive could not get under budget (pinned or leased copies hold the rest)."""
    c = catalog
    code = c.replica_code(replica, create=False)
    rows = np.flatnonzero(c.col("alive") & (c.col("replica") == code))
    nbytes = c.col("nbytes")[rows].astype(np.int64)
    used = int(nbytes.sum())
    if used <= budget_bytes:
        return EvictionPlan(replica, (), 0, used, budget_bytes, 0)
    keys = c.col("key")[rows]
    steps = None
    if next_use:
        steps = np.array([next_use.get(k, -1) for k in keys.tolist()], dtype=np.int64)
    age = (now_s - c.epoch_s) - c.col("last_used_s")[rows]
    scores = eviction_scores(c.col("hits")[rows], nbytes, age, steps, weights)
    scores = scores - 1e-9 * c.col("position_offset")[rows]  # NOTE: suffix blocks go first on ties
    evictable = (c.col("pins")[rows] == 0) & (c.col("lease_until_s")[rows] < now_s - c.epoch_s)
    order = eviction_order(scores, evictable)
    freed = np.cumsum(nbytes[order])
    n = int(np.searchsorted(freed, used - budget_bytes, side="left")) + 1
    chosen = order[: min(n, len(order))]
    freed_bytes = int(nbytes[chosen].sum())
    shortfall = max(0, used - freed_bytes - budget_bytes)
    return EvictionPlan(replica, tuple(int(k) for k in keys[chosen]), freed_bytes, used, budget_bytes, shortfall)
