"""KV-state manager: the cluster's view of every KV block copy and state, with lineage.

A plain class (``graphflow.runtime.actors`` wraps it in a named Ray actor). Replicas send it
batched events; a workflow node needs at most two round trips:

1. ``begin_node(tokens)`` — longest matching prefix on every replica, leasing the best
   match so it is not evicted while the node runs;
2. ``apply(events)`` — the node's admits (new blocks + state with lineage) and evictions.

When a workflow run is over, ``end_run(run, now_s)``: its state records (the tokens each
covers, its lineage) are kept ``retain_ended_s`` longer, for lineage queries and recovery
plans, then forgotten. Without that the records of every node ever served stayed, and a
snapshot, which writes them all and holds the manager meanwhile, grew with the deployment's age
(``graphflow bench manager-life``: 0.55 s after 30,000 nodes, against 0.11 s with runs ended).
A run begun with its client (``begin_run``) whose client goes away without ending it is ended
for it (``end_runs_of``, which the manager's actor calls: ``runtime.manager_actor``). Which
runs are running or ended, and which are due, is kept by ``graphflow.kv.run_ledger``.
Forgetting records also drops the catalog's evicted rows that no kept record and no live row
(as a parent) names (``Catalog.compact``).

Times are passed in (``now_s``), never read from a clock here (only snapshot pacing and timing,
in ``graphflow.kv.manager_snapshot``, read a monotonic clock).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from graphflow.kv.catalog import Catalog
from graphflow.kv.copies import evict_copies, locate, longest_prefix, record_copies, rows_on, validate_blocks
from graphflow.kv.copy_order import CopyOrder
from graphflow.kv.events import (
    AdmitEvent,
    EvictEvent,
    EvictionPlan,
    ManagerStats,
    NodeLookup,
    PrefixHits,
    PrefixMatch,
    RecoveryPlan,
    RecoveryStep,
    ReplicaInfo,
    StateRecord,
    TemplateEvent,
    TemplateHolding,
    batch_from_blocks,
)
from graphflow.kv.eviction_plan import plan_eviction
from graphflow.kv.keys import ROOT_KEY, chain_keys
from graphflow.kv.manager_snapshot import SnapshotPacer, read_snapshot, write_snapshot
from graphflow.kv.recovery_plan import plan_recovery
from graphflow.kv.run_ledger import RETAIN_ENDED_S, RunLedger
from graphflow.kv.state_index import StateIndex
from scheduler.eviction import EvictionWeights

__all__ = [
    "AdmitEvent",
    "EvictEvent",
    "EvictionPlan",
    "KVStateManager",
    "ManagerStats",
    "RETAIN_ENDED_S",
    "NodeLookup",
    "PrefixMatch",
    "RecoveryPlan",
    "RecoveryStep",
    "ReplicaInfo",
    "StateRecord",
    "batch_from_blocks",
]


class KVStateManager:
    """Catalog + states + replicas; see the module docstring for the call pattern."""

    def __init__(
        self,
        block_tokens: int = 16,
        epoch_s: float = 0.0,
        weights: EvictionWeights | None = None,
        retain_ended_s: float = RETAIN_ENDED_S,
    ) -> None:
        if block_tokens <= 0:
            raise ValueError(f"block_tokens must be positive, got {block_tokens}")
        self._runs = RunLedger(retain_ended_s)
        self._snapshot_s = 0.0  # how long the last snapshot took
        self.block_tokens = block_tokens
        self.catalog = Catalog(epoch_s)
        self.weights = weights or EvictionWeights()
        self._replicas: dict[str, ReplicaInfo] = {}
        self._states = StateIndex()
        self._lookups = 0
        self._hits: dict[str, int] = {}
        self._hit_tokens: dict[str, int] = {}
        self._templates: dict[str, tuple[TemplateHolding, ...]] = {}  # replica → what it can rebuild
        self._template_stamps: dict[str, int] = {}  # replica → stamp of the templates report applied
        self._order = CopyOrder()  # NOTE: in memory only; a restarted manager resyncs from the replicas
        self._pacer: SnapshotPacer | None = None

    # ---- snapshots (graphflow.kv.manager_snapshot) ---------------------------------------
    def snapshot(self, folder: str | Path) -> None:
        """Write the catalog, states and replicas into ``folder`` (atomically swapped in)."""
        runs, states = self._runs, list(self._states)
        self._snapshot_s = write_snapshot(
            folder, self.catalog, states, self.replicas, self.block_tokens, runs.ended, runs.owners
        )

    def enable_snapshots(self, folder: str | Path, every_s: float = 5.0) -> None:
        """Snapshot into ``folder`` after event batches, at most once every ``every_s`` seconds."""
        self._pacer = SnapshotPacer(folder, every_s)

    def _maybe_snapshot(self) -> None:
        if self._pacer is not None and self._pacer.due():
            self.snapshot(self._pacer.folder)

    @classmethod
    def restore(
        cls, folder: str | Path, weights: EvictionWeights | None = None, retain_ended_s: float = RETAIN_ENDED_S
    ) -> KVStateManager:
        """A manager rebuilt from :meth:`snapshot`; ``ValueError`` for another schema version."""
        mgr = cls(weights=weights, retain_ended_s=retain_ended_s)
        mgr.load_snapshot(folder)
        return mgr

    def load_snapshot(self, folder: str | Path) -> int:
        """Replace this manager's contents with a :meth:`snapshot` (how a restarted manager
        actor recovers); returns the number of states restored. ``ValueError``: no snapshot
        there, or one of another schema version (this manager is left as it was)."""
        snap = read_snapshot(folder)
        self.catalog, self.block_tokens = snap.catalog, snap.block_tokens
        self._replicas = {info.name: info for info in snap.replicas}
        self._states = StateIndex(snap.records)
        self._runs.ended = dict(snap.ended)
        self._runs.owners = dict(snap.owners)
        return len(snap.records)

    # ---- replicas ------------------------------------------------------------------------
    def add_replica(self, info: ReplicaInfo) -> None:
        if info.budget_bytes <= 0:
            raise ValueError(f"replica {info.name!r} needs a positive byte budget, got {info.budget_bytes}")
        self._replicas[info.name] = info
        self.catalog.replica_code(info.name)

    def replica(self, name: str) -> ReplicaInfo:
        try:
            return self._replicas[name]
        except KeyError:
            raise ValueError(f"unknown replica {name!r}; known: {sorted(self._replicas)}") from None

    @property
    def replicas(self) -> list[ReplicaInfo]:
        return list(self._replicas.values())

    def drop_replica(self, name: str) -> int:
        """Forget a replica that died: every block copy it held is marked gone (pins and leases
        included: the bytes no longer exist); states keep their lineage, so they can be rebuilt.
        Returns the number of block copies dropped."""
        dropped = self._drop(name)
        self._order.forget(name)
        self._template_stamps.pop(name, None)
        return dropped

    def _drop(self, name: str) -> int:
        self.replica(name)
        code = self.catalog.replica_code(name, create=False)
        rows = np.flatnonzero(self.catalog.col("alive") & (self.catalog.col("replica") == code))
        self.catalog.kill(rows.astype(np.int64))
        del self._replicas[name]
        self._templates.pop(name, None)
        return len(rows)

    def resync_replica(self, info: ReplicaInfo, admits: Sequence[AdmitEvent], now_s: float = 0.0) -> int:
        """Make the catalog agree with what a replica reports holding (after a manager restart
        from an older snapshot): its old copies are dropped, each reported state is admitted —
        a state the snapshot already knows only gets its block copies back, and lineage
        parents the manager never heard of are left out. Returns the states reported."""
        if info.name in self._replicas:
            self._drop(info.name)  # NOTE: the order kept: a stale change arriving later must not undo these admits
        self.add_replica(info)
        for ev in admits:
            state = ev.record.state
            if state.state_id in self._states:
                validate_blocks(self.catalog, ev.blocks)
                self._record(ev, now_s)
                continue
            known = tuple(p for p in state.lineage.parents if p in self._states)
            if known != state.lineage.parents:
                state = replace(state, lineage=replace(state.lineage, parents=known))
                ev = replace(ev, record=replace(ev.record, state=state))
            self._admit(ev, now_s)
        return len(admits)

    def list_replicas(self) -> list[ReplicaInfo]:
        """The registered replicas (a method, so Ray actor callers can ask for it)."""
        return self.replicas

    # ---- events --------------------------------------------------------------------------
    def apply(self, events: Sequence[AdmitEvent | EvictEvent | TemplateEvent], now_s: float) -> None:
        """Apply a batch of replica events in order. Each admit is validated before anything
        changes; a bad admit raises ``ValueError`` and leaves the manager as it was before it.
        A ``TemplateEvent`` replaces what its replica reported it can rebuild."""
        for ev in events:
            if isinstance(ev, AdmitEvent):
                self._admit(ev, now_s)
            elif isinstance(ev, TemplateEvent):
                self.replica(ev.replica)
                if ev.stamp and ev.stamp < self._template_stamps.get(ev.replica, 0):
                    continue  # NOTE: a newer report of this replica's templates was applied already
                self._template_stamps[ev.replica] = max(ev.stamp, self._template_stamps.get(ev.replica, 0))
                self._templates[ev.replica] = tuple(ev.holdings)
            else:
                newer = self._order.newer(ev.replica, ev.keys, ev.stamp)  # NOTE: those stay as they are
                keys = [k for k in ev.keys if k not in newer]
                evict_copies(self.catalog, ev.replica, keys)
                self._order.applied(ev.replica, keys, ev.stamp, held=False)
        self._maybe_snapshot()

    def templates_for(self, op: str, path: tuple[str, ...], version: str) -> tuple[tuple[str, TemplateHolding], ...]:
        """``(replica, holding)`` for every replica that can rebuild ``op``'s template (of
        ``version``) after ``path``: a residual for that path, or a path-free base."""
        out = []
        for replica, held in self._templates.items():
            if replica not in self._replicas:
                continue
            fits = [h for h in held if h.op == op and h.version == version and h.path in (path, None)]
            if fits:
                out.append((replica, min(fits, key=lambda h: h.path is None)))  # a residual over a bare base
        return tuple(out)

    def _admit(self, ev: AdmitEvent, now_s: float) -> None:
        self.replica(ev.replica)
        batch, state = ev.blocks, ev.record.state
        if batch.replica != ev.replica:
            raise ValueError(f"admit from {ev.replica!r} carries blocks of {batch.replica!r}")
        if state.state_id in self._states:
            known = self._states.get(state.state_id)
            if known.state.block_keys == state.block_keys and known.token_bytes == ev.record.token_bytes:
                # NOTE: the same admit delivered again (a replica resynced after a manager restart
                # already reported it): record the copies, change nothing else
                validate_blocks(self.catalog, batch)
                self._record(ev, now_s)
                return
            raise ValueError(f"state {state.state_id!r} is already registered with other contents; use a new id")
        unknown = [p for p in state.lineage.parents if p not in self._states]
        if unknown:
            raise ValueError(f"state {state.state_id!r} names unknown parent states {unknown}")
        validate_blocks(self.catalog, batch)
        outside = np.setdiff1d(np.asarray(state.block_keys, dtype=np.uint64), batch.key.astype(np.uint64))
        missing = outside[self.catalog.rows_of_many(outside) < 0]
        if len(missing):
            raise ValueError(f"state {state.state_id!r} references {len(missing)} blocks that were never admitted")
        self._record(ev, now_s)
        self._states.add(ev.record)

    def _record(self, ev: AdmitEvent, now_s: float) -> None:
        """Record a validated admit's block copies; those a newer change already evicted are
        recorded gone (``graphflow.kv.copy_order``: the admit arrived after it), and so are those
        whose last change is no longer remembered and may be newer than the admit, unless the
        manager lists them there already (the admit then tells it nothing new)."""
        keys = [int(k) for k in ev.blocks.key.astype(np.uint64)]
        unsure = [k for k in self._order.unsure(ev.replica, keys, ev.stamp) if ev.replica not in self.locate(k)]
        record_copies(self.catalog, ev.blocks, now_s)
        newer = self._order.newer(ev.replica, keys, ev.stamp)
        gone = [k for k, held in newer.items() if not held] + unsure
        if gone:
            evict_copies(self.catalog, ev.replica, gone)
        self._order.applied(ev.replica, [k for k in keys if k not in newer], ev.stamp, held=True)

    def state_ids(self) -> list[str]:
        """The states whose records it keeps, in admission order."""
        return [r.state.state_id for r in self._states]

    # ---- runs (graphflow.kv.run_ledger) -----------------------------------------------------
    def begin_run(self, run: str, owner: str) -> None:
        """``run`` starts, driven by the client ``owner`` (its Ray job id; "" for none): if that
        client goes away without ending the run, :meth:`end_runs_of` ends it."""
        self._runs.begin(run, owner)

    def run_owners(self) -> set[str]:
        """The clients of the runs begun and not yet ended."""
        return self._runs.running_owners()

    def end_runs_of(self, owners: Iterable[str], now_s: float) -> list[str]:
        """End the runs of clients that are gone (``owners``), as each would have; returns them."""
        runs = self._runs.runs_of(owners)
        for run in runs:
            self.end_run(run, now_s)
        return runs

    def end_run(self, run: str, now_s: float) -> int:
        """``run`` is over (no more admits will name its states); its records go once
        ``retain_ended_s`` has passed (:meth:`forget_ended`). Returns the records forgotten now."""
        self._runs.end(run, now_s)
        return self.forget_ended(now_s)

    def forget_ended(self, now_s: float) -> int:
        """Forget the records of runs that ended ``retain_ended_s`` or more before ``now_s``
        (each ``end_run`` does this; the manager's actor also does it every minute, so an idle
        deployment forgets too). Returns the records forgotten."""
        forgotten = sum(self._states.forget_run(r) for r in self._runs.due(now_s))
        if forgotten:
            recorded = [k for rec in self._states for k in rec.state.block_keys]
            self.catalog.compact(np.asarray(recorded, dtype=np.uint64))
        return forgotten

    # ---- queries -------------------------------------------------------------------------
    def locate(self, key: int) -> list[str]:
        """Replicas holding a live copy of block ``key``."""
        return locate(self.catalog, key)

    def longest_prefix(self, keys: Sequence[int]) -> list[PrefixMatch]:
        """Per replica, how many leading blocks of ``keys`` it holds; longest first."""
        return longest_prefix(self.catalog, keys)

    def begin_node(
        self,
        token_ids: Sequence[int],
        model_key: str,
        now_s: float,
        lease_s: float = 30.0,
        prefer: str | None = None,
        template: tuple[str, tuple[str, ...], str] | None = None,
    ) -> NodeLookup:
        """Round trip 1 of a node: prefix matches everywhere (the best match is leased until
        ``now_s + lease_s`` and hit) and, given ``template`` = (op, path, version), the replicas
        that can rebuild that template from base (+ residual)."""
        keys = tuple(chain_keys(token_ids, model_key, self.block_tokens))
        matches = self.longest_prefix(keys)
        self._lookups += 1
        held = self.templates_for(*template) if template is not None else ()
        if not matches:
            return NodeLookup(keys, (), None, held)
        best = next((m for m in matches if m.replica == prefer and m.num_blocks == matches[0].num_blocks), matches[0])
        rows = rows_on(self.catalog, keys[: best.num_blocks], best.replica)
        self._hits[best.replica] = self._hits.get(best.replica, 0) + 1
        self._hit_tokens[best.replica] = self._hit_tokens.get(best.replica, 0) + best.num_tokens
        self.catalog.touch(rows, now_s)
        self.catalog.set_lease(rows, now_s + lease_s)
        return NodeLookup(keys, tuple(matches), best.replica, held)

    def state(self, state_id: str) -> StateRecord:
        return self._states.get(state_id)

    def ancestors(self, state_id: str) -> list[str]:
        """All states ``state_id`` was derived from, nearest first (breadth-first)."""
        return self._states.ancestors(state_id)

    def descendants(self, state_id: str) -> list[str]:
        """All states derived from ``state_id``, nearest first."""
        return self._states.descendants(state_id)

    def placement(self, state_id: str) -> list[tuple[int, str, str, str]]:
        """``(block key, node, replica, device)`` for every live copy of the state's blocks."""
        out = []
        for key in self.state(state_id).state.block_keys:
            for replica in self.locate(key):
                info = self._replicas.get(replica, ReplicaInfo(replica))
                out.append((key, info.node, replica, info.device))
        return out

    def summary(self) -> ManagerStats:
        """What it holds (records, catalog rows) and how its runs stand."""
        return ManagerStats(
            records=len(self._states),
            catalog_rows=len(self.catalog.col("key")),
            live_copies=len(self.catalog),
            running_runs=len(self._runs.owners),
            ended_runs=len(self._runs.ended),
            abandoned_runs=self._runs.abandoned,
            snapshot_s=self._snapshot_s,
        )

    def hit_stats(self) -> dict[str, PrefixHits]:
        """Per replica: prefix lookups it answered best, their share of all lookups, tokens matched."""
        lookups = max(1, self._lookups)
        hits = {r: self._hits.get(r, 0) for r in self._replicas}
        return {r: PrefixHits(n, n / lookups, self._hit_tokens.get(r, 0)) for r, n in hits.items()}

    def states_owning(self, keys: Sequence[int], replica: str) -> list[str]:
        """States that admitted the replica's copies of ``keys`` (sorted, unique)."""
        rows = rows_on(self.catalog, tuple(keys), replica) if keys else np.zeros(0, dtype=np.int64)
        return sorted(set(self.catalog.names(self.catalog.col("state")[rows])))

    def used_bytes(self, replica: str) -> int:
        code = self.catalog.replica_code(replica, create=False)
        c = self.catalog
        mask = c.col("alive") & (c.col("replica") == code)
        return int(c.col("nbytes")[mask].sum())

    # ---- pins and leases -----------------------------------------------------------------
    def pin(self, keys: Iterable[int], replica: str, delta: int = 1) -> None:
        """Pin (``delta=1``) or unpin (``-1``) the replica's copies of ``keys``."""
        rows = rows_on(self.catalog, tuple(keys), replica)
        self.catalog.add_pins(rows, delta)

    def lease(self, keys: Iterable[int], replica: str, until_s: float) -> None:
        self.catalog.set_lease(rows_on(self.catalog, tuple(keys), replica), until_s)

    # ---- eviction and recovery -----------------------------------------------------------
    def plan_eviction(
        self, replica: str, now_s: float, next_use: dict[int, int] | None = None, budget_bytes: int | None = None
    ) -> EvictionPlan:
        """Which of the replica's blocks to evict to get under its byte budget (or
        ``budget_bytes``): :func:`graphflow.kv.eviction_plan.plan_eviction`. Plans only."""
        budget = self.replica(replica).budget_bytes if budget_bytes is None else budget_bytes
        return plan_eviction(self.catalog, replica, budget, now_s, self.weights, next_use)

    def recovery_plan(self, state_id: str, replica: str) -> RecoveryPlan:
        """How to rebuild a state on ``replica``: reuse its own leading blocks, transfer the
        next ones from another replica, recompute (prefill) the rest from the recorded tokens
        (:func:`graphflow.kv.recovery_plan.plan_recovery`)."""
        self.replica(replica)
        rec = self.state(state_id)
        keys = rec.state.block_keys
        return plan_recovery(
            state_id, replica, keys, rec.num_tokens, self.block_tokens, self.locate, self.ancestors(state_id)
        )

    # ---- invariants ----------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise ``RuntimeError`` if the catalog and states disagree."""
        c = self.catalog
        alive = c.col("alive")
        keys = c.col("key")
        ever = set(keys.tolist())
        parents = c.col("parent_key")[alive]
        orphan = [p for p in set(parents.tolist()) if p != ROOT_KEY and p not in ever]
        if orphan:
            raise RuntimeError(f"{len(orphan)} blocks have parents the catalog never saw")
        if (c.col("pins") < 0).any():
            raise RuntimeError("negative pin counts")
        for row in np.flatnonzero(alive)[:: max(1, int(alive.sum()) // 1000)].tolist():
            if row not in c.rows_of(int(keys[row])):
                raise RuntimeError(f"live row {row} is not reachable through the key index")
        for rec in self._states:
            if any(k not in ever for k in rec.state.block_keys):
                raise RuntimeError(f"state {rec.state.state_id!r} references blocks the catalog never saw")
            if any(p not in self._states for p in rec.state.lineage.parents):
                raise RuntimeError(f"state {rec.state.state_id!r} has unknown parents")
