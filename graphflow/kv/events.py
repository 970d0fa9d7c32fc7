"""Messages and results of the KV-state manager: replica events, lookups, plans.

Small frozen dataclasses that cross the manager's boundary (and the Ray actor boundary).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from graphflow.kv.catalog import BlockBatch
from graphflow.kv.state import KVState

if TYPE_CHECKING:  # NOTE: not at run time: these messages cross into processes without torch
    from graphflow.kv.block import KVBlock

__all__ = [
    "AdmitEvent",
    "EvictEvent",
    "EvictionPlan",
    "ManagerStats",
    "NodeLookup",
    "PrefixHits",
    "PrefixMatch",
    "RecoveryPlan",
    "RecoveryStep",
    "ReplicaInfo",
    "StateRecord",
    "TemplateEvent",
    "TemplateHolding",
    "batch_from_blocks",
    "take_rows",
]


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    name: str
    node: str = "localhost"
    device: str = "cpu"
    budget_bytes: int = 1 << 30
    address: str = ""  # transport address peers use to reach it
    transport: str = ""  # the backend that address belongs to (ucx, ray, local)
    host: str = ""  # the node's IP address ("" = this host)


@dataclass(frozen=True, slots=True)
class StateRecord:
    """A registered state: the KVState plus the tokens it covers (enough to recompute it).

    Tokens are kept as little-endian int32 bytes (4 bytes a token, not a Python int's ~32).
    """

    state: KVState
    token_bytes: bytes

    @classmethod
    def of(cls, state: KVState, token_ids: Sequence[int]) -> StateRecord:
        return cls(state, np.asarray(token_ids, dtype="<i4").tobytes())

    @property
    def token_ids(self) -> list[int]:
        return np.frombuffer(self.token_bytes, dtype="<i4").tolist()

    @property
    def num_tokens(self) -> int:
        return len(self.token_bytes) // 4


@dataclass(frozen=True, slots=True, eq=False)
class AdmitEvent:
    """A replica stored ``blocks`` and registered ``state`` (whose block keys they cover);
    ``stamp`` orders it among the replica's changes (``graphflow.kv.copy_order``; 0: unordered)."""

    replica: str
    record: StateRecord
    blocks: BlockBatch
    stamp: int = 0


@dataclass(frozen=True, slots=True)
class EvictEvent:
    replica: str
    keys: tuple[int, ...]
    state_id: str = ""  # when a whole state was released
    stamp: int = 0  # its order among the replica's changes (graphflow.kv.copy_order; 0: unordered)


@dataclass(frozen=True, slots=True)
class TemplateHolding:
    """A replica can rebuild ``op``'s template (of ``tokens`` tokens, version ``version``) from
    its base plus, for ``path``, a residual of ``nbytes``; ``path`` is ``None`` for a base
    that serves every path (stateless mode). ``recompute`` head tokens are recomputed."""

    op: str
    path: tuple[str, ...] | None
    version: str
    tokens: int
    nbytes: int
    recompute: int = 0


@dataclass(frozen=True, slots=True)
class TemplateEvent:
    """Everything a replica can rebuild now (replaces what it reported before, unless ``stamp``
    says that report is newer: ``graphflow.kv.copy_order``; 0: unordered, always applied)."""

    replica: str
    holdings: tuple[TemplateHolding, ...]
    stamp: int = 0


@dataclass(frozen=True, slots=True)
class PrefixHits:
    """One replica's share of the manager's prefix lookups: those it answered best, their
    fraction of all lookups, and the tokens they matched."""

    hits: int = 0
    hit_rate: float = 0.0
    hit_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ManagerStats:
    """What the KV manager holds and how its runs stand (``graphflow status``).

    Attributes:
        records: state records kept (those of running runs, and of ended runs for a while).
        catalog_rows: block copies the catalog lists, evicted ones that a record still names included.
        live_copies: of those, the copies replicas hold now.
        running_runs: runs begun by a client and not ended.
        ended_runs: runs ended whose records are still kept.
        abandoned_runs: runs it ended because their client was gone.
        snapshot_s: how long its last snapshot took (0.0: none taken).
    """

    records: int = 0
    catalog_rows: int = 0
    live_copies: int = 0
    running_runs: int = 0
    ended_runs: int = 0
    abandoned_runs: int = 0
    snapshot_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    replica: str
    num_blocks: int
    num_tokens: int


@dataclass(frozen=True, slots=True)
class NodeLookup:
    keys: tuple[int, ...]
    matches: tuple[PrefixMatch, ...]  # best first
    leased_replica: str | None
    templates: tuple[tuple[str, TemplateHolding], ...] = ()  # (replica, holding) for the node's template


@dataclass(frozen=True, slots=True)
class EvictionPlan:
    replica: str
    keys: tuple[int, ...]
    freed_bytes: int
    used_bytes: int
    budget_bytes: int
    shortfall_bytes: int  # > 0 when pinned/leased blocks keep the replica over budget


@dataclass(frozen=True, slots=True)
class RecoveryStep:
    action: str  # "reuse" | "transfer" | "recompute"
    replica: str
    source: str
    blocks: tuple[int, int]  # block index range [lo, hi)
    tokens: tuple[int, int]


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    state_id: str
    replica: str
    steps: tuple[RecoveryStep, ...]
    lineage: tuple[str, ...] = field(default=())

    @property
    def recompute_tokens(self) -> int:
        return sum(s.tokens[1] - s.tokens[0] for s in self.steps if s.action == "recompute")


def batch_from_blocks(
    blocks: Sequence[KVBlock], replica: str, state_id: str, kind: str = "context", op: str = "", path_hash: int = 0
) -> BlockBatch:
    """The catalog rows for blocks a replica just stored."""
    return BlockBatch(
        replica=replica,
        state=state_id,
        key=np.array([b.key for b in blocks], dtype=np.uint64),
        parent_key=np.array([b.parent_key for b in blocks], dtype=np.uint64),
        position_offset=np.array([b.position_offset for b in blocks], dtype=np.int32),
        num_tokens=np.array([b.num_tokens for b in blocks], dtype=np.int16),
        nbytes=np.array([b.nbytes for b in blocks], dtype=np.int32),
        checksum=np.array([b.checksum for b in blocks], dtype=np.uint64),
        kind=kind,
        op=op,
        path_hash=path_hash,
    )


def take_rows(batch: BlockBatch, mask: np.ndarray) -> BlockBatch:
    if mask.all():
        return batch
    return BlockBatch(
        replica=batch.replica,
        state=batch.state,
        key=batch.key[mask],
        parent_key=batch.parent_key[mask],
        position_offset=batch.position_offset[mask],
        num_tokens=batch.num_tokens[mask],
        nbytes=batch.nbytes[mask],
        checksum=batch.checksum[mask],
        kind=batch.kind,
        op=batch.op,
        path_hash=batch.path_hash,
    )
