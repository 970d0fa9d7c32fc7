"""Persistence of the KV-state manager: Parquet snapshots, written atomically, and read back.

Plain functions over the manager's parts (catalog, state records, replicas), and a pacer that
says when the next periodic snapshot is due; :class:`graphflow.kv.manager.KVStateManager`
holds one and calls them. A restarted manager loads the last snapshot, then resyncs each
replica's holdings (``KVStateManager.resync_replica``).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from graphflow.kv.catalog import Catalog
from graphflow.kv.events import ReplicaInfo, StateRecord
from graphflow.kv.state_table import read_states, write_states

__all__ = ["RUNS_FILE", "Snapshot", "SnapshotPacer", "read_snapshot", "write_snapshot"]

RUNS_FILE = "runs.json"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a snapshot folder holds."""

    catalog: Catalog
    records: list[StateRecord]
    replicas: list[ReplicaInfo]
    block_tokens: int
    ended: dict[str, float]  # runs that had ended, with when, whose records were still kept
    owners: dict[str, str]  # runs begun and not ended → their client's Ray job id


def write_snapshot(
    folder: str | Path,
    catalog: Catalog,
    records: Sequence[StateRecord],
    replicas: Sequence[ReplicaInfo],
    block_tokens: int,
    ended: dict[str, float] | None = None,
    owners: dict[str, str] | None = None,
) -> float:
    """Write ``catalog.parquet`` and ``states.parquet`` (plus replicas) into ``folder``, and
    ``runs.json``: the runs that have ended whose records are still kept, and the clients of
    those still running (so a restored manager forgets both in time too).

    Written into a sibling folder first and swapped in, so a crash mid-write leaves the
    previous snapshot whole. Returns the seconds it took."""
    started = time.perf_counter()
    folder = Path(folder)
    tmp, old = folder.with_name(folder.name + ".new"), folder.with_name(folder.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    catalog.write_parquet(tmp / "catalog.parquet")
    write_states(tmp / "states.parquet", list(records), list(replicas), block_tokens)
    (tmp / RUNS_FILE).write_text(json.dumps({"ended": ended or {}, "owners": owners or {}}))
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return time.perf_counter() - started


def read_snapshot(folder: str | Path) -> Snapshot:
    """A :func:`write_snapshot` folder read back.

    Raises:
        ValueError: the folder holds no snapshot, or one of another schema version.
    """
    folder = Path(folder)
    if not (folder / "states.parquet").is_file():
        raise ValueError(f"no manager snapshot in {folder}; start from an empty manager instead")
    records, replicas, block_tokens = read_states(folder / "states.parquet")
    runs_file = folder / RUNS_FILE  # NOTE: absent from older versions' snapshots: no runs known
    runs = json.loads(runs_file.read_text()) if runs_file.is_file() else {}
    ended = {str(r): float(t) for r, t in runs.get("ended", {}).items()}
    owners = {str(r): str(o) for r, o in runs.get("owners", {}).items()}
    return Snapshot(Catalog.read_parquet(folder / "catalog.parquet"), records, replicas, block_tokens, ended, owners)


class SnapshotPacer:
    """Snapshots into ``folder`` after event batches, at most once every ``every_s`` seconds
    (the only clock the manager reads: pacing, never catalog times)."""

    def __init__(self, folder: str | Path, every_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        if every_s < 0:
            raise ValueError(f"every_s must be non-negative, got {every_s}")
        self.folder, self.every_s, self._clock = Path(folder), every_s, clock
        self._last = float("-inf")

    def due(self) -> bool:
        """Whether a snapshot is due now; if so, the next one is paced from now."""
        now = self._clock()
        if now - self._last < self.every_s:
            return False
        self._last = now
        return True
