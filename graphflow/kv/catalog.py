"""Central block catalog: one row per block *copy* (key, replica), columnar, Arrow on disk.

Columns (in memory as numpy arrays; on disk as one Parquet file with these names):

| column | type | meaning |
|---|---|---|
| ``key`` | uint64 | block hash-chain key (see ``graphflow.kv.block``) |
| ``replica`` | int16 | replica holding this copy (code into ``replicas``) |
| ``kind`` | int8 | 0 context, 1 output, 2 base, 3 residual |
| ``op`` | int32 | workflow operation that produced it (code into ``names``; -1 none) |
| ``path_hash`` | uint64 | hash of the prefix path (differential KV; 0 when not applicable) |
| ``position_offset`` | int32 | absolute position of the block's first token |
| ``num_tokens`` | int16 | tokens in the block |
| ``nbytes`` | int32 | bytes of the block tensor |
| ``checksum`` | uint64 | xxh3-64 of the block bytes |
| ``parent_key`` | uint64 | key of the previous block in the chain (0 = root) |
| ``state`` | int32 | KV state that first registered this copy (code into ``names``) |
| ``created_s`` | float32 | seconds since the catalog's epoch when admitted |
| ``last_used_s`` | float32 | seconds since the epoch of the last hit |
| ``hits`` | int32 | lookups that reused this copy |
| ``pins`` | int16 | pin count; pinned copies are never evicted |
| ``lease_until_s`` | float32 | copy is leased (not evictable) until then |
| ``alive`` | bool | false once evicted (the row stays: lineage needs every key ever seen) |

Lineage lives with the states (``StateRecord``: parents, operator, tokens), since a state
owns many blocks. Hot lookups go through a key index: a sorted ``(key, row)`` array queried
with ``searchsorted`` plus a small dict of recent inserts, merged in bulk — ~16 bytes per
block instead of a Python dict's ~100.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["CATALOG_VERSION", "COLUMNS", "KINDS", "BlockBatch", "Catalog"]

CATALOG_VERSION = 1
KINDS = ("context", "output", "base", "residual")
COLUMNS: dict[str, np.dtype] = {
    name: np.dtype(dt)
    for name, dt in [
        ("key", "u8"),
        ("replica", "i2"),
        ("kind", "i1"),
        ("op", "i4"),
        ("path_hash", "u8"),
        ("position_offset", "i4"),
        ("num_tokens", "i2"),
        ("nbytes", "i4"),
        ("checksum", "u8"),
        ("parent_key", "u8"),
        ("state", "i4"),
        ("created_s", "f4"),
        ("last_used_s", "f4"),
        ("hits", "i4"),
        ("pins", "i2"),
        ("lease_until_s", "f4"),
        ("alive", "?"),
    ]
}


@dataclass(frozen=True, slots=True, eq=False)
class BlockBatch:
    """Blocks one replica admits at once (arrays of equal length; one state, one op)."""

    replica: str
    state: str
    key: np.ndarray
    parent_key: np.ndarray
    position_offset: np.ndarray
    num_tokens: np.ndarray
    nbytes: np.ndarray
    checksum: np.ndarray
    kind: str = "context"
    op: str = ""
    path_hash: int = 0

    def __post_init__(self) -> None:
        n = len(self.key)
        lengths = {len(a) for a in (self.parent_key, self.position_offset, self.num_tokens, self.nbytes, self.checksum)}
        if lengths != {n}:
            raise ValueError(f"block batch arrays must all have {n} entries")
        if self.kind not in KINDS:
            raise ValueError(f"block kind must be one of {KINDS}, got {self.kind!r}")

    def __len__(self) -> int:
        return len(self.key)


class Catalog:
    """Columnar block-copy table with a key index. Plain class: no I/O except snapshots.

    Args:
        epoch_s: wall-clock origin of the float32 timestamps (seconds since the Unix epoch).
    """

    _MERGE_AT = 1 << 16

    def __init__(self, epoch_s: float = 0.0) -> None:
        self.epoch_s = epoch_s
        self._cols = {name: np.zeros(1024, dtype=dt) for name, dt in COLUMNS.items()}
        self._n = 0
        self._names: list[str] = [""]
        self._name_codes: dict[str, int] = {"": 0}
        self._replicas: list[str] = []
        self._replica_codes: dict[str, int] = {}
        self._sorted_keys = np.zeros(0, dtype=np.uint64)
        self._sorted_rows = np.zeros(0, dtype=np.int64)
        self._recent: dict[int, list[int]] = {}
        self._dirty = False  # rows were killed since the last merge

    # ---- names ---------------------------------------------------------------------------
    def name_code(self, name: str) -> int:
        code = self._name_codes.get(name)
        if code is None:
            code = self._name_codes[name] = len(self._names)
            self._names.append(name)
        return code

    def replica_code(self, replica: str, create: bool = True) -> int:
        code = self._replica_codes.get(replica)
        if code is None:
            if not create:
                raise ValueError(f"unknown replica {replica!r}; known: {self._replicas}")
            code = self._replica_codes[replica] = len(self._replicas)
            self._replicas.append(replica)
        return code

    def replica_name(self, code: int) -> str:
        return self._replicas[code]

    @property
    def replicas(self) -> list[str]:
        return list(self._replicas)

    # ---- rows ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._cols["alive"][: self._n].sum())

    def col(self, name: str) -> np.ndarray:
        """A read-only view of a column over all rows (alive or not)."""
        view = self._cols[name][: self._n]
        view.flags.writeable = False
        return view

    def rows_of(self, key: int) -> list[int]:
        """Rows of all live copies of ``key``."""
        k = np.uint64(key)
        lo = int(np.searchsorted(self._sorted_keys, k, side="left"))
        hi = int(np.searchsorted(self._sorted_keys, k, side="right"))
        rows = self._sorted_rows[lo:hi].tolist() + self._recent.get(key, [])
        alive = self._cols["alive"]
        return [r for r in rows if alive[r]]

    def rows_of_many(self, keys: np.ndarray) -> np.ndarray:
        """For each key, one live row or -1 (vectorized over the sorted index; recent inserts
        are looked up in their dict, so no merge is forced)."""
        if self._dirty:
            self._merge()
        keys = np.asarray(keys, dtype=np.uint64)
        rows = np.full(len(keys), -1, dtype=np.int64)
        if len(self._sorted_keys):
            pos = np.minimum(np.searchsorted(self._sorted_keys, keys), len(self._sorted_keys) - 1)
            found = self._sorted_keys[pos] == keys
            rows[found] = self._sorted_rows[pos[found]]
        if self._recent:
            recent = self._recent
            for i, k in enumerate(keys.tolist()):
                hit = recent.get(k)
                if hit is not None and rows[i] < 0:
                    rows[i] = hit[0]
        live = rows >= 0
        live[live] = self._cols["alive"][rows[live]]
        return np.where(live, rows, -1)

    def append(self, batch: BlockBatch, now_s: float) -> np.ndarray:
        """Append rows for ``batch`` (already validated by the caller); returns their row ids."""
        n = len(batch)
        self._reserve(self._n + n)
        rows = np.arange(self._n, self._n + n, dtype=np.int64)
        c, sl = self._cols, slice(self._n, self._n + n)
        c["key"][sl] = batch.key
        c["replica"][sl] = self.replica_code(batch.replica)
        c["kind"][sl] = KINDS.index(batch.kind)
        c["op"][sl] = self.name_code(batch.op)
        c["path_hash"][sl] = batch.path_hash
        c["position_offset"][sl] = batch.position_offset
        c["num_tokens"][sl] = batch.num_tokens
        c["nbytes"][sl] = batch.nbytes
        c["checksum"][sl] = batch.checksum
        c["parent_key"][sl] = batch.parent_key
        c["state"][sl] = self.name_code(batch.state)
        c["created_s"][sl] = c["last_used_s"][sl] = now_s - self.epoch_s
        c["hits"][sl] = c["pins"][sl] = 0
        c["lease_until_s"][sl] = -np.inf
        c["alive"][sl] = True
        self._n += n
        if n >= self._MERGE_AT:
            self._merge(extra=(batch.key, rows))
        else:
            for k, r in zip(batch.key.tolist(), rows.tolist(), strict=True):
                self._recent.setdefault(k, []).append(r)
            if len(self._recent) >= self._MERGE_AT:
                self._merge()
        return rows

    def kill(self, rows: np.ndarray) -> None:
        """Mark rows evicted (index entries are dropped lazily at the next merge)."""
        self._cols["alive"][rows] = False
        self._dirty = True

    def compact(self, keep_keys: np.ndarray) -> int:
        """Drop evicted rows no one can ask about any more: those whose key is neither in
        ``keep_keys`` (the blocks of the states still recorded) nor the parent of a live row.
        Row ids change (the index is rebuilt) and names no row uses are dropped. Returns the rows
        dropped. NOTE: an admit whose first block's parent was dropped is refused as having an
        unknown parent; replicas admit a state's whole chain from the root, so theirs never is."""
        n, c = self._n, self._cols
        alive = c["alive"][:n]
        keys = c["key"][:n]
        keep = alive | np.isin(keys, np.asarray(keep_keys, dtype=np.uint64)) | np.isin(keys, c["parent_key"][:n][alive])
        dropped = n - int(keep.sum())
        if dropped == 0:
            return 0
        for name in COLUMNS:
            kept = c[name][:n][keep]
            c[name][: len(kept)] = kept
        self._n = n - dropped
        codes = np.concatenate((c["state"][: self._n], c["op"][: self._n], np.zeros(1, dtype=np.int32)))
        used = np.unique(codes[codes >= 0])  # NOTE: code 0 is the empty name; -1 (no op) stays as it is
        recode = np.zeros(len(self._names), dtype=np.int32)
        recode[used] = np.arange(len(used), dtype=np.int32)
        self._names = [self._names[i] for i in used.tolist()]
        self._name_codes = {name: i for i, name in enumerate(self._names)}
        for name in ("state", "op"):
            col = c[name][: self._n]
            col[:] = np.where(col >= 0, recode[np.maximum(col, 0)], col)
        self._merge(rebuild=True)
        return dropped

    def touch(self, rows: np.ndarray, now_s: float) -> None:
        np.add.at(self._cols["hits"], rows, 1)
        self._cols["last_used_s"][rows] = now_s - self.epoch_s

    def add_pins(self, rows: np.ndarray, delta: int) -> None:
        pins = self._cols["pins"]
        if delta < 0 and (pins[rows] + delta < 0).any():
            raise ValueError("unpinning blocks that are not pinned")
        np.add.at(pins, rows, delta)

    def set_lease(self, rows: np.ndarray, until_s: float) -> None:
        self._cols["lease_until_s"][rows] = until_s - self.epoch_s

    def names(self, codes: np.ndarray) -> list[str]:
        return [self._names[c] for c in codes.tolist()]

    def nbytes_in_memory(self) -> int:
        """Bytes of every array the catalog holds (columns with their slack, and the index)."""
        cols = sum(a.nbytes for a in self._cols.values())
        index = self._sorted_keys.nbytes + self._sorted_rows.nbytes
        return cols + index + 120 * len(self._recent)

    # ---- snapshot ------------------------------------------------------------------------
    def to_table(self) -> pa.Table:
        # NOTE: evicted rows are kept: lineage and parent checks need every key ever admitted.
        arrays = {name: pa.array(self._cols[name][: self._n]) for name in COLUMNS}
        meta = {
            "graphflow.catalog_version": str(CATALOG_VERSION),
            "graphflow.epoch_s": repr(self.epoch_s),
            "graphflow.names": json.dumps(self._names),
            "graphflow.replicas": json.dumps(self._replicas),
        }
        return pa.table(arrays).replace_schema_metadata(meta)

    def write_parquet(self, path: str | Path) -> None:
        pq.write_table(self.to_table(), str(path), compression="lz4")

    @classmethod
    def read_parquet(cls, path: str | Path) -> Catalog:
        """A new catalog from a snapshot. Raises ``ValueError`` for another schema version."""
        table = pq.read_table(str(path))
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        version = meta.get("graphflow.catalog_version")
        if version != str(CATALOG_VERSION):
            raise ValueError(
                f"snapshot {path} has catalog version {version}, this GraphFlow reads version {CATALOG_VERSION}; "
                "take a new snapshot with this version (or restore with the version that wrote it)"
            )
        missing = set(COLUMNS) - set(table.column_names)
        if missing:
            raise ValueError(f"snapshot {path} lacks columns {sorted(missing)}; it is not a GraphFlow catalog")
        cat = cls(epoch_s=float(meta["graphflow.epoch_s"]))
        cat._names = json.loads(meta["graphflow.names"])
        cat._name_codes = {n: i for i, n in enumerate(cat._names)}
        cat._replicas = json.loads(meta["graphflow.replicas"])
        cat._replica_codes = {n: i for i, n in enumerate(cat._replicas)}
        n = table.num_rows
        cat._reserve(n)
        for name, dt in COLUMNS.items():
            cat._cols[name][:n] = table.column(name).to_numpy().astype(dt, copy=False)
        cat._n = n
        cat._merge(rebuild=True)
        return cat

    # ---- helpers -------------------------------------------------------------------------
    def _reserve(self, n: int) -> None:
        cap = len(self._cols["key"])
        if n <= cap:
            return
        new_cap = max(n, cap + cap // 2)
        for name, arr in self._cols.items():
            grown = np.zeros(new_cap, dtype=arr.dtype)
            grown[: self._n] = arr[: self._n]
            self._cols[name] = grown

    def _merge(self, extra: tuple[np.ndarray, np.ndarray] | None = None, rebuild: bool = False) -> None:
        """Fold recent inserts (and ``extra`` rows) into the sorted index, dropping dead rows."""
        if not self._recent and extra is None and not rebuild and not self._dirty:
            return
        if rebuild:
            keys, rows = self._cols["key"][: self._n], np.arange(self._n, dtype=np.int64)
        else:
            parts_k, parts_r = [self._sorted_keys], [self._sorted_rows]
            if self._recent:
                flat = [(k, r) for k, rs in self._recent.items() for r in rs]
                parts_k.append(np.fromiter((k for k, _ in flat), dtype=np.uint64, count=len(flat)))
                parts_r.append(np.fromiter((r for _, r in flat), dtype=np.int64, count=len(flat)))
            if extra is not None:
                parts_k.append(extra[0].astype(np.uint64))
                parts_r.append(extra[1])
            keys, rows = np.concatenate(parts_k), np.concatenate(parts_r)
        live = self._cols["alive"][rows]
        keys, rows = keys[live], rows[live]
        order = np.argsort(keys, kind="stable")
        self._sorted_keys, self._sorted_rows = keys[order], rows[order]
        self._recent = {}
        self._dirty = False
