"""Persistence of the KV-state manager: Parquet snapshots, written atomically, and restore.

A mixin of :class:`graphflow.kv.manager.KVStateManager` (kept apart so the manager module
holds the catalog logic only). A restarted manager loads the last snapshot, then resyncs each
replica's holdings (``KVStateManager.resync_replica``).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, TypeVar

from graphflow.kv.catalog import Catalog
from graphflow.kv.events import ReplicaInfo, StateRecord
from graphflow.kv.state_table import read_states, write_states
from scheduler.eviction import EvictionWeights

__all__ = ["Snapshots"]

M = TypeVar("M", bound="Snapshots")


class Snapshots:
    """Snapshot, periodic snapshots and restore for the manager's catalog and states."""

    catalog: Catalog
    block_tokens: int
    _replicas: dict[str, ReplicaInfo]
    _states: dict[str, StateRecord]
    _children: dict[str, set[str]]
    _snapshots: tuple[Path, float] | None
    _last_snapshot: float

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("Snapshots is a mixin of KVStateManager; it is not used on its own")

    def snapshot(self, folder: str | Path) -> None:
        """Write ``catalog.parquet`` and ``states.parquet`` (plus replicas) into ``folder``.

        Written into a sibling folder first and swapped in, so a crash mid-write leaves the
        previous snapshot whole."""
        folder = Path(folder)
        tmp, old = folder.with_name(folder.name + ".new"), folder.with_name(folder.name + ".old")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.catalog.write_parquet(tmp / "catalog.parquet")
        replicas = list(self._replicas.values())
        write_states(tmp / "states.parquet", list(self._states.values()), replicas, self.block_tokens)
        shutil.rmtree(old, ignore_errors=True)
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)

    def enable_snapshots(self, folder: str | Path, every_s: float = 5.0) -> None:
        """Snapshot into ``folder`` after event batches, at most once every ``every_s`` seconds."""
        if every_s < 0:
            raise ValueError(f"every_s must be non-negative, got {every_s}")
        self._snapshots = (Path(folder), every_s)
        self._last_snapshot = float("-inf")

    def _maybe_snapshot(self) -> None:
        if self._snapshots is None:
            return
        folder, every_s = self._snapshots
        now = time.monotonic()
        if now - self._last_snapshot >= every_s:
            self.snapshot(folder)
            self._last_snapshot = now

    @classmethod
    def restore(cls: type[M], folder: str | Path, weights: EvictionWeights | None = None) -> M:
        """A manager rebuilt from :meth:`snapshot`; ``ValueError`` for another schema version."""
        mgr = cls(weights=weights)
        mgr.load_snapshot(folder)
        return mgr

    def load_snapshot(self, folder: str | Path) -> int:
        """Replace this manager's contents with a :meth:`snapshot` (how a restarted manager
        actor recovers); returns the number of states restored."""
        folder = Path(folder)
        if not (folder / "states.parquet").is_file():
            raise ValueError(f"no manager snapshot in {folder}; start from an empty manager instead")
        records, replicas, block_tokens = read_states(folder / "states.parquet")
        self.catalog = Catalog.read_parquet(folder / "catalog.parquet")
        self.block_tokens = block_tokens
        self._replicas = {info.name: info for info in replicas}
        self._states = {}
        self._children = {}
        for rec in records:
            self._states[rec.state.state_id] = rec
            for p in rec.state.lineage.parents:
                self._children.setdefault(p, set()).add(rec.state.state_id)
        return len(records)
