"""Which replica holds a copy of which block, read and written on the catalog.

Pure functions over :class:`~graphflow.kv.catalog.Catalog` columns, the part of the KV-state
manager that knows block copies and not states: validating a batch of blocks a replica admits,
recording its copies (a re-admit changes nothing, a copy reported under other bytes replaces the
old row), dropping evicted copies, and the lookups the scheduler asks for (who holds a block,
each replica's longest prefix of a chain, a replica's rows of some keys).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from graphflow.kv.catalog import BlockBatch, Catalog
from graphflow.kv.events import PrefixMatch, take_rows
from graphflow.kv.keys import ROOT_KEY

__all__ = ["evict_copies", "locate", "longest_prefix", "record_copies", "rows_on", "validate_blocks"]


def validate_blocks(catalog: Catalog, batch: BlockBatch) -> None:
    """Raise ``ValueError`` when ``batch`` holds one key twice with different bytes, or a block
    whose parent is neither in the batch nor ever admitted."""
    keys, parents = batch.key.astype(np.uint64), batch.parent_key.astype(np.uint64)
    order = np.argsort(keys, kind="stable")
    same = keys[order][1:] == keys[order][:-1]
    if same.any() and (batch.checksum[order][1:][same] != batch.checksum[order][:-1][same]).any():
        raise ValueError("the batch holds one block key twice with different bytes; refused")
    need = (parents != ROOT_KEY) & ~np.isin(parents, keys)
    if need.any():
        ever = catalog.rows_of_many(parents[need]) >= 0
        if not ever.all():
            dead = [p for p in parents[need][~ever].tolist() if not _ever_known(catalog, p)]
            if dead:
                raise ValueError(f"{len(dead)} blocks have unknown parents (first {dead[0]:016x}); admit parents first")


def record_copies(catalog: Catalog, batch: BlockBatch, now_s: float) -> None:
    """Record a validated batch's block copies on its replica: rows it replaced go, copies
    already recorded are kept as they are."""
    _supersede(catalog, batch)
    catalog.append(take_rows(batch, _not_on_replica(catalog, batch)), now_s)


def evict_copies(catalog: Catalog, replica: str, keys: Sequence[int]) -> None:
    """Drop ``replica``'s copies of ``keys``; ``ValueError`` (nothing dropped) if one is pinned."""
    code = catalog.replica_code(replica, create=False)
    reps, pins = catalog.col("replica"), catalog.col("pins")
    rows = [r for k in keys for r in catalog.rows_of(k) if reps[r] == code]
    if any(pins[r] > 0 for r in rows):
        raise ValueError(f"replica {replica!r} reports evicting pinned blocks; unpin them first")
    catalog.kill(np.asarray(rows, dtype=np.int64))


def locate(catalog: Catalog, key: int) -> list[str]:
    """Replicas holding a live copy of block ``key``."""
    reps = catalog.col("replica")
    return [catalog.replica_name(int(reps[r])) for r in catalog.rows_of(key)]


def longest_prefix(catalog: Catalog, keys: Sequence[int]) -> list[PrefixMatch]:
    """Per replica, how many leading blocks of ``keys`` it holds; longest first."""
    reps, ntok = catalog.col("replica"), catalog.col("num_tokens")
    alive_on: set[int] | None = None
    counts: dict[int, tuple[int, int]] = {}
    for i, k in enumerate(keys):
        here = {int(reps[r]): int(ntok[r]) for r in catalog.rows_of(k)}
        alive_on = set(here) if alive_on is None else alive_on & set(here)
        if not alive_on:
            break
        for code in alive_on:
            counts[code] = (i + 1, counts.get(code, (0, 0))[1] + here[code])
    matches = [PrefixMatch(catalog.replica_name(c), b, t) for c, (b, t) in counts.items()]
    return sorted(matches, key=lambda m: (-m.num_blocks, m.replica))


def rows_on(catalog: Catalog, keys: Sequence[int], replica: str) -> np.ndarray:
    """``replica``'s catalog rows of ``keys``, in order; ``ValueError`` if it lacks one."""
    code = catalog.replica_code(replica, create=False)
    reps = catalog.col("replica")
    rows = [r for k in keys for r in catalog.rows_of(k) if reps[r] == code]
    if len(rows) != len(keys):
        raise ValueError(f"replica {replica!r} does not hold all {len(keys)} blocks asked for")
    return np.asarray(rows, dtype=np.int64)


def _supersede(catalog: Catalog, batch: BlockBatch) -> None:
    """A replica reporting a block it is recorded with under other bytes replaced it (it
    dropped a corrupt copy and recomputed it; its store holds one version per key): the old
    row goes. Other replicas may each hold their own version of a key (the same tokens computed
    along another path differ by rounding); each row keeps its checksum."""
    code = catalog.replica_code(batch.replica)
    reps, sums = catalog.col("replica"), catalog.col("checksum")
    stale = [
        r
        for i in np.flatnonzero(catalog.rows_of_many(batch.key) >= 0).tolist()
        for r in catalog.rows_of(int(batch.key[i]))
        if reps[r] == code and sums[r] != batch.checksum[i]
    ]
    if stale:
        catalog.kill(np.asarray(stale, dtype=np.int64))


def _ever_known(catalog: Catalog, key: int) -> bool:
    return bool((catalog.col("key") == np.uint64(key)).any())


def _not_on_replica(catalog: Catalog, batch: BlockBatch) -> np.ndarray:
    """Mask of batch blocks its replica does not already hold (re-admits are no-ops)."""
    code = catalog.replica_code(batch.replica)
    mask = np.ones(len(batch), dtype=bool)
    reps = catalog.col("replica")
    for i in np.flatnonzero(catalog.rows_of_many(batch.key) >= 0).tolist():
        if any(reps[r] == code for r in catalog.rows_of(int(batch.key[i]))):
            mask[i] = False
    return mask
