"""How a replica carries out a node's plan and materializes a task context.

:meth:`NodeRunner.run` follows the executor's :class:`~graphflow.runtime.plan.NodePlan` along
the context (the picture in ``runtime.replica``): it waits for a prefix another node is
receiving here, looks up the blocks its own store holds, receives the planned range from the
source replica, prefills the rest (or rebuilds a template), decodes greedily and stores the
whole state, sharing the blocks it continued instead of copying them. What it computes goes
through ``runtime.replica_compute``; what it keeps, through ``runtime.replica_store``.
:meth:`NodeRunner.materialize` stores a task context once, running no forward for the part
already held.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from graphflow.kv.block import KVBlock
from graphflow.kv.events import TemplateEvent
from graphflow.kv.exchange import receive_blocks, spec_for_prompt
from graphflow.kv.manager import AdmitEvent, EvictEvent
from graphflow.kv.state import Lineage
from graphflow.kv.state_index import run_of, transfer_state
from graphflow.runtime.arrivals import Arrivals
from graphflow.runtime.deliveries import Deliveries
from graphflow.runtime.kept import KeptStates
from graphflow.runtime.plan import MaterializeResult, NodePlan, NodeResult
from graphflow.runtime.prefixes import SharedPrefixes
from graphflow.runtime.receive_pool import ReceivePool
from graphflow.runtime.replica_compute import NodeCompute
from graphflow.runtime.replica_config import ReplicaConfig
from graphflow.runtime.replica_store import ReplicaStore
from scheduler.policy import Option
from transport.base import Transport

__all__ = ["NodeRunner"]


class NodeRunner:
    """The node path of one replica.

    Args:
        config: the replica's configuration (name, block size, timeouts, model name).
        kept: its stored states.
        held: the eviction table they follow (which states ready nodes need next).
        compute: its prefill and decode; its model, engine loop (``None``: batching off) and
            store lock are the runner's too.
        transport: where planned ranges are received from.
        pool: its prefaulted receive memory, which yields to the KV each node computes.
        deliveries: which of its store changes the manager has heard of (each result carries
            the evictions waiting, a call whose run ended keeps nothing: ``runtime.deliveries``).
    """

    def __init__(
        self,
        config: ReplicaConfig,
        kept: ReplicaStore,
        held: KeptStates,
        compute: NodeCompute,
        transport: Transport,
        pool: ReceivePool,
        deliveries: Deliveries,
    ) -> None:
        self.config = config
        self.deliveries = deliveries
        self.pool = pool
        self.kept = kept
        self.held = held
        self.compute = compute
        self.transport = transport
        self.engine, self.batcher, self._lock = compute.engine, compute.batcher, compute.lock
        self._kv_bytes_per_token = compute.engine.kv_bytes_per_token()
        self.prefixes = SharedPrefixes(compute.engine)  # shared prefixes the engine loop reads, built once each
        self._arrivals = Arrivals()  # prefixes being received here, for nodes that wait for them

    def run(self, plan: NodePlan) -> NodeResult:
        """Carry out ``plan`` (see the module docstring). Raises ``ValueError`` on a bad request;
        a transfer that fails raises the transport's error (the executor recomputes)."""
        if not plan.tokens:
            raise ValueError("a node needs at least one context token")
        n_tmpl = plan.template.tokens if plan.template else 0
        if n_tmpl > len(plan.tokens):
            raise ValueError(f"the template ({n_tmpl} tokens) must fit in the context ({len(plan.tokens)} tokens)")
        self._check_length(len(plan.tokens) + plan.decode_steps)
        evicted: list[EvictEvent] = []
        stored: list[str] = []
        try:
            with self._failing_waits(evicted, stored):
                res = self._run(plan, n_tmpl, evicted, stored)
        finally:
            lo, hi = plan.receive
            if hi > lo:  # NOTE: also when it failed: nodes waiting for these blocks then prefill them
                self._arrivals.landed(plan.tokens[:hi])
        (prefix, admit), told = self._hand_over(plan.state_id, (res.kept_prefix, res.admit), res.evicted)
        report = self.template_report()
        return replace(
            res, admit=admit, kept_prefix=prefix, evicted=told, templates=report.holdings, templates_stamp=report.stamp
        )

    def _run(self, plan: NodePlan, n_tmpl: int, evicted: list[EvictEvent], stored: list[str]) -> NodeResult:
        """The node itself; ``evicted`` gathers the evictions it makes as it goes, ``stored`` the
        states it keeps before its own (its received prefix)."""
        start = time.perf_counter()
        ids = list(plan.tokens)
        with self._lock:
            self.held.note_next_use(plan.run_id, plan.next_use, plan.owner)
        notes: list[str] = []
        marks: list[tuple[str, float]] = []
        local, received, moved, found = self._prefix(plan, ids, n_tmpl, notes, marks)
        evicted += found
        hi = plan.receive[1]
        prefix = local + received
        cached = len(prefix) * self.config.block_tokens
        batched = self.batcher is not None and not self.compute.templated(plan, ids, cached)
        # NOTE: _local_prefix verified every local block, the transport every received one
        shared = self.prefixes.acquire(prefix) if batched and prefix else None
        # NOTE: what the node computes counts against the receive pool until it is stored: its
        # room (batched), or a cache holding its whole context (unbatched)
        computing = len(ids) + plan.decode_steps - (cached if batched else 0)
        with self.pool.computing(self._kv_bytes(computing)):
            try:
                if batched:
                    assert self.batcher is not None
                    marks.append(("rebuild", time.perf_counter()))
                    req = self.batcher.submit(ids[cached:], None, shared, max(1, plan.decode_steps))
                    first, rebuilt = req.wait_first(), 0
                else:
                    cache = self.compute.cache_of(prefix)
                    marks.append(("rebuild", time.perf_counter()))
                    first, cache, rebuilt, why = self.compute.prefill(plan, ids, cached, cache)
                    notes += [why] if why else []
                ttft = time.perf_counter() - start
                marks.append(("prefill", start + ttft))
                # NOTE: only when the own prefix reached the range; kept after the first token, off its path
                kept_prefix = None
                if received:
                    try:
                        kept_prefix, more = self._keep_received(plan, ids[:hi], local + received)
                        evicted += more
                        stored += [transfer_state(plan.state_id)] if kept_prefix else []
                    finally:
                        self._arrivals.landed(ids[:hi])
                    marks.append(("keep_received", time.perf_counter()))
                if batched:
                    output, cache = req.result(), req.cache
                else:
                    output = [first, *self.compute.decode(cache, first, plan.decode_steps - 1)]
            finally:
                if shared is not None:
                    self.prefixes.release(prefix)
            marks.append(("decode", time.perf_counter()))
            # a rebuilt template is approximate: never offer it to later nodes as an exact prefix
            keep = plan.keep and not rebuilt
            admit, more = self._keep(plan, ids + output[:-1], cache, prefix if shared else []) if keep else (None, [])
            evicted += more
            marks.append(("keep", time.perf_counter()))
        transferred = len(received) * self.config.block_tokens
        return NodeResult(
            state_id=plan.state_id,
            replica=self.config.name,
            output_ids=tuple(output),
            text=self.engine.tokenizer.decode(list(output)),
            reused_tokens=cached - transferred,
            transferred_tokens=transferred,
            prefill_tokens=len(ids) - cached - rebuilt,
            bytes_moved=moved,
            ttft_s=ttft,
            total_s=time.perf_counter() - start,
            admit=admit,
            kept_prefix=kept_prefix,
            evicted=tuple(evicted),
            rebuilt_tokens=rebuilt,
            note="; ".join(notes),
            phases=tuple((name, t - prev) for (_, prev), (name, t) in zip([("", start), *marks], marks, strict=False)),
        )

    def _prefix(
        self, plan: NodePlan, ids: list[int], n_tmpl: int, notes: list[str], marks: list[tuple[str, float]]
    ) -> tuple[list[KVBlock], list[KVBlock], int, list[EvictEvent]]:
        """The stored blocks the node continues: its own (looked up, unless it recomputes), then
        those the plan receives. Returns (own, received, bytes received, evictions the lookup
        made); appends to ``notes`` what went other than planned and to ``marks`` the phases."""
        use_cache = plan.keep and plan.option is not Option.RECOMPUTE
        rebuild_at = len(ids) - n_tmpl if plan.option is Option.RECONSTRUCT else len(ids)
        if plan.await_tokens and not self._arrivals.wait(ids[: plan.await_tokens], self.config.timeout_s):
            notes.append(f"the prefix arriving here had not landed after {self.config.timeout_s:.0f} s; prefilled it")
        local, evicted = self.kept.local_prefix(ids, rebuild_at) if use_cache else ([], [])
        marks.append(("lookup", time.perf_counter()))
        lo, hi = plan.receive
        if hi <= lo:
            return local, [], 0, evicted
        bt = self.config.block_tokens
        local = local[: lo // bt]
        moved, received = self._receive(plan, ids[:hi])
        marks.append(("receive", time.perf_counter()))
        if len(local) * bt < lo:
            notes.append(f"own prefix shrank to {len(local) * bt} tokens; prefilled more")
            self._arrivals.landed(ids[:hi])
            return local, [], moved, evicted
        return local, received, moved, evicted

    def materialize(self, state_id: str, tokens: Sequence[int]) -> MaterializeResult:
        """Prefill ``tokens`` once and store them as ``state_id`` (the task context root); the
        leading blocks this replica already holds (a context computed upstream, or submitted
        again) are reused, not prefilled; a context held whole runs no forward at all.

        Returns the seconds it took and the events for the manager: states evicted to make
        room, then the admit (none when the state is larger than the whole store)."""
        ids = list(tokens)
        if not ids:
            raise ValueError("the task context is empty: give the workflow a task of at least one token")
        self._check_length(len(ids))
        begin = time.perf_counter()
        local, evicted = self.kept.local_prefix(ids, len(ids), leave=0)
        cached = len(local) * self.config.block_tokens
        computing = self.pool.computing(self._kv_bytes(len(ids) - (cached if self.batcher is not None else 0)))
        with self._failing_waits(evicted), computing:
            # held whole (computed upstream, or submitted again): nothing to run
            blocks = local if cached == len(ids) else self._prefill_context(ids, local)
            admit, more = self.kept.store_state(blocks, Lineage("materialize"), state_id, ids)
        seconds = time.perf_counter() - begin
        kept = admit is not None
        (admit,), told = self._hand_over(state_id, (admit,), (*evicted, *more))
        events: tuple[AdmitEvent | EvictEvent, ...] = (*told, *([admit] if admit else []))
        return MaterializeResult(self.config.name, len(ids), seconds, kept, events, reused=cached)

    def template_report(self) -> TemplateEvent:
        """What the replica can rebuild from base (+ residual) now, stamped as taken (under the
        store lock), so the manager keeps the latest of these reports (``graphflow.kv.copy_order``)."""
        with self._lock:
            holdings = self.compute.templates.holdings() if self.compute.templates else ()
            return TemplateEvent(self.config.name, holdings, self.kept.stamp())

    @contextmanager
    def _failing_waits(self, evicted: list[EvictEvent], stored: Sequence[str] = ()) -> Iterator[None]:
        """Should the call fail, the evictions it made (``evicted``, as gathered so far) wait for
        the replica's next result, and the states it stored (``stored``) are released: no result
        of this call will carry their events."""
        try:
            yield
        except BaseException:
            self.release_unread(stored, evicted)
            raise

    def release_unread(self, states: Sequence[str], evicted: Sequence[EvictEvent] = ()) -> None:
        """Release those of ``states`` this replica still keeps, which no result reaching the
        manager announces; their evictions wait for the next result after ``evicted``."""
        with self._lock:
            kept = [s for s in states if s in self.held]
            self.deliveries.wait([*evicted, *(self.kept.evict(s) for s in kept)], released=len(kept))

    def _hand_over(
        self, state_id: str, admits: tuple[AdmitEvent | None, ...], evicted: Sequence[EvictEvent]
    ) -> tuple[tuple[AdmitEvent | None, ...], tuple[EvictEvent, ...]]:
        """What the result of the call that stored ``state_id`` tells the manager: the evictions
        waiting for a result, then its own, and its ``admits`` (returned in the same places). A
        call whose run ended while it ran (timed out or failed elsewhere) keeps nothing: its
        states are released, its result tells nothing (``None`` in every place), and what changed
        waits for the next result (``runtime.deliveries``)."""
        with self._lock:
            kept = [s for s in (state_id, transfer_state(state_id)) if s in self.held]
            if self.held.ended(run_of(state_id)):
                self.release_unread(kept, evicted)
                return (None,) * len(admits), ()
            told = (*self.deliveries.take(self.kept.store.has_block), *evicted)
            self.deliveries.sent(state_id, kept, told)
            return admits, told

    def _prefill_context(self, ids: list[int], local: list[KVBlock]) -> list[KVBlock]:
        """The blocks of a task context of which this replica holds the blocks ``local``."""
        cached = len(local) * self.config.block_tokens
        if self.batcher is not None:  # NOTE: a room of the context's size, which becomes its blocks
            shared = self.prefixes.acquire(local) if local else None
            try:
                req = self.batcher.submit(ids[cached:], None, shared, 1)
                req.result()
            finally:
                if local:
                    self.prefixes.release(local)
            return self.compute.blocks_of(ids, req.cache, local)
        cache = self.compute.forward(ids[cached:], self.compute.cache_of(local))[1]
        return self.compute.blocks_of(ids, cache, [])

    def _kv_bytes(self, tokens: int) -> int:
        return max(tokens, 0) * self._kv_bytes_per_token

    def max_positions(self) -> int:
        """The longest context this replica's model accepts (0: no stated limit)."""
        return int(getattr(self.engine.config, "max_position_embeddings", 0) or 0)

    def _check_length(self, n: int) -> None:
        limit = self.max_positions()
        if limit and n > limit:
            raise ValueError(
                f"the context needs {n} positions but {self.config.model} accepts at most {limit}; "
                "shorten the task or its workflow's outputs"
            )

    def _keep(
        self, plan: NodePlan, state_tokens: list[int], cache: Any, prefix: list[KVBlock]
    ) -> tuple[AdmitEvent | None, list[EvictEvent]]:
        """Store the node's whole state (KV for every token but the last output) for reuse:
        ``prefix`` (stored blocks the node continued; ``cache`` then holds only what follows)
        plus the blocks cut from ``cache``."""
        blocks = self.compute.blocks_of(state_tokens, cache, prefix)
        return self.kept.store_state(blocks, Lineage("node", plan.parents), plan.state_id, state_tokens)

    def _receive(self, plan: NodePlan, ids: list[int]) -> tuple[int, list[KVBlock]]:
        """Receive the blocks of ``ids[lo:]`` (full blocks only; ``lo`` from the plan) from the
        plan's source; returns the bytes received and the blocks."""
        bt, lo = self.config.block_tokens, plan.receive[0]
        n = len(ids) // bt * bt
        spec = spec_for_prompt(self.engine.identity, ids[:n], bt, plan.source_address, plan.transfer_id, lo)
        received, stats = receive_blocks(self.transport, spec)
        return stats.nbytes, received

    def _keep_received(
        self, plan: NodePlan, ids: list[int], blocks: list[KVBlock]
    ) -> tuple[AdmitEvent | None, list[EvictEvent]]:
        """Keep the own prefix + received blocks as a state of their own when they fit (they
        were used for the node either way); returns its admit (``None``: no room) and the
        evictions that made room."""
        n = len(blocks) * self.config.block_tokens
        return self.kept.store_state(blocks, Lineage("transfer"), transfer_state(plan.state_id), ids[:n])
