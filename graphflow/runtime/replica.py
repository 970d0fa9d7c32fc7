"""A model replica as a plain class: engine + block store + transport endpoint.

``graphflow.runtime.actors`` wraps it in a Ray actor; tests drive it directly. It carries out
the executor's :class:`~graphflow.runtime.plan.NodePlan`:

```
context tokens [0 ── local ── lo ────── hi ──────── start ─────────── end)
                └ own store ┘└ received ┘└ prefilled ┘└ template ───────┘
                  REUSE        TRANSFER                  RECONSTRUCT: base (+ residual),
                                                         only its last token prefilled
   ─► greedy decode ─► pack the whole state, store it (shared blocks are not copied)
   ─► admits / evictions for the manager, what it can rebuild now, a per-node trace
```

This module wires the parts and is the replica's API. The node path (wait for an arriving
prefix, look up, receive, prefill or rebuild, decode, store) is ``runtime.replica_nodes``; the
states it keeps live in ``runtime.replica_store``; its prefill and decode (engine loop or not,
template KV or not) in ``runtime.replica_compute``; what it sends to peers (blocks, link
probes, the faults ``check faults`` injects) in ``runtime.replica_sends``; which of its store
changes the manager has heard of (a result nobody collected) in ``runtime.deliveries``.
Eviction, when a new state does not fit, follows ``runtime.kept``: lowest eviction score first
(hits, bytes freed, age, the running workflows' steps until next use), never a state a ready
node needs; ``eviction="oldest"`` keeps the old oldest-first order (an ablation).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import torch

from graphflow.kv.differential.codecs import ResidualCodec
from graphflow.kv.differential.modes import KVMode, TemplateStats, kv_mode
from graphflow.kv.differential.template_kv import TemplateKV
from graphflow.kv.events import TemplateEvent
from graphflow.kv.manager import AdmitEvent, EvictEvent, ReplicaInfo
from graphflow.kv.state import Placement
from graphflow.kv.store import BlockStore
from graphflow.models.engine import Engine
from graphflow.models.prefix_kernel import prefix_kernel
from graphflow.models.ragged import unsupported
from graphflow.models.threads import per_thread_support
from graphflow.runtime.batch_limits import BATCH_ROWS
from graphflow.runtime.batcher import Batcher
from graphflow.runtime.deliveries import Deliveries
from graphflow.runtime.kept import EVICTION_POLICIES, KeptStates
from graphflow.runtime.memory import release_freed_memory, reset_peak_rss, resident_bytes
from graphflow.runtime.plan import MaterializeResult, NodePlan, NodeResult
from graphflow.runtime.receive_pool import ReceivePool
from graphflow.runtime.replica_compute import NodeCompute
from graphflow.runtime.replica_config import ReplicaConfig
from graphflow.runtime.replica_nodes import NodeRunner
from graphflow.runtime.replica_sends import Sends
from graphflow.runtime.replica_store import ReplicaStore
from graphflow.runtime.stats import ReplicaStats, Route
from graphflow.workflow.corpus import Workflow
from graphflow.workflow.planner import CheckpointPlanner
from transport.base import Transport, TransportConfig
from transport.memory import host_arena

__all__ = ["EVICTION_POLICIES", "ReplicaWorker"]


ARENA_RECYCLE_BYTES = 2 << 30  # idle arena slabs kept for reuse beside the prefaulted pool


def _templates(engine: Engine, config: ReplicaConfig) -> TemplateKV | None:
    mode = kv_mode(config.kv_mode)
    if mode is KVMode.EXACT:
        return None
    codec = ResidualCodec(recompute_head=config.recompute_head, recompute_fraction=config.recompute_fraction)
    return TemplateKV(engine, mode, codec, config.residual_refs, config.hot_min_count)


def _prefix_reading(engine: Engine, batcher: Batcher | None) -> str:
    """How nodes read the stored prefixes they continue: "in place (avx512)" (the engine loop's
    rows, :mod:`graphflow.models.prefix_kernel`, built here once a host; or its portable build),
    else how and why."""
    if batcher is None:
        return "copied into each node's cache (no engine loop)"
    dtype = next(engine.model.parameters()).dtype
    kernel = prefix_kernel()
    why = kernel.unusable(engine.identity.layout.head_dim, dtype, torch.device(engine.device))
    return f"gathered a layer at a time: {why}" if why else f"in place ({kernel.isa})"


class ReplicaWorker:
    def __init__(self, config: ReplicaConfig, clock: Callable[[], float] = time.monotonic) -> None:
        from transport.registry import create

        self.config = config
        self.clock = clock
        # NOTE: Ray starts actors with OMP_NUM_THREADS=1; the engine gets the threads asked for.
        # With the engine loop they are the loop thread's alone and every other thread runs
        # serial (graphflow.models.threads), so nothing parallel may run before it starts.
        self.threads = config.threads or os.cpu_count() or 1
        one_parallel = config.batching and not per_thread_support()
        torch.set_num_threads(1 if one_parallel else self.threads)
        self.engine = Engine.load(config.model, device=config.device, linear_kernel=config.linear_kernel)
        store = BlockStore(
            self.engine.identity,
            config.capacity_bytes,
            config.block_tokens,
            Placement(config.name, node=config.node or "localhost", device=config.device),
        )
        held = KeptStates(config.eviction, clock)
        self.kept = ReplicaStore(store, held, config.name, self.engine.identity.model_key, config.block_tokens)
        self.store, self._held, self._lock = store, held, self.kept.lock  # NOTE: one lock for every store mutation
        self.abandoned_runs = 0  # runs ended here because their client went away (end_runs_of)
        kwargs: dict[str, Any] = {"name": f"replica:{config.name}"} if config.transport in ("ray", "local") else {}
        self.transport: Transport = create(config.transport, TransportConfig(timeout_s=config.timeout_s), **kwargs)
        self.templates = _templates(self.engine, config)
        self.deliveries = Deliveries()  # NOTE: under self._lock, as every store change
        self.sends = Sends(
            config.name,
            self.transport,
            store,
            self._lock,
            self.engine.identity.model_key,
            config.block_tokens,
            self.engine.kv_bytes_per_token() * config.block_tokens,
            self.deliveries,
            self.kept.stamp,
        )
        self.pool = ReceivePool(host_arena(), config.prefault_bytes, store, ARENA_RECYCLE_BYTES)
        self.batcher, self.batching_off = self._engine_loop(self.threads if one_parallel else 0)
        if one_parallel and self.batcher is None:  # no loop after all: every thread computes
            torch.set_num_threads(self.threads)
        # NOTE: built here (a second, once a host) rather than in the first step that reads a prefix
        self.prefix_reading = _prefix_reading(self.engine, self.batcher)
        self.compute = NodeCompute(self.engine, self.batcher, self.templates, self._lock, config.block_tokens)
        self.nodes = NodeRunner(config, self.kept, held, self.compute, self.transport, self.pool, self.deliveries)
        self._active = 0  # node calls in this replica now (receiving, queued or running)
        self.planner = CheckpointPlanner()  # loaded at the first plan() call

    def _engine_loop(self, threads: int) -> tuple[Batcher | None, str]:
        """The engine loop when batching is on and the model allows it, else why not;
        ``threads`` > 0: its thread alone computes in parallel, on that many."""
        if not self.config.batching:
            return None, "turned off"
        why = unsupported(self.engine.model)
        if why:
            return None, why
        loop = Batcher(self.engine, self.config.max_batch_tokens, BATCH_ROWS, self.config.max_queue, threads)
        loop.start()
        loop.measure_padding()
        return loop, ""

    def close(self) -> None:
        """Stop the engine loop (queued requests fail)."""
        if self.batcher is not None:
            self.batcher.stop()

    # ---- identity ------------------------------------------------------------------------
    def address(self) -> str:
        return self.transport.address

    def model_key(self) -> str:
        return self.engine.identity.model_key

    def encode(self, text: str) -> list[int]:
        return self.engine.tokenizer.encode(text)

    def decode_text(self, ids: Sequence[int]) -> str:
        return self.engine.tokenizer.decode(list(ids))

    def plan(self, task: str) -> Workflow:
        """The workflow the trained generator picks for ``task`` (the packaged checkpoint, loaded
        at the first task and again once it changed). Clients plan here so that they never load
        torch: the replica has it loaded already, a fresh client took about 1 s to import it."""
        return self.planner.generate(task)

    # ---- node execution ------------------------------------------------------------------
    def run_node(self, plan: NodePlan) -> NodeResult:
        """Carry out ``plan`` (:meth:`NodeRunner.run <graphflow.runtime.replica_nodes.NodeRunner.run>`);
        while it runs it counts in :meth:`queue_length`."""
        with self._lock:
            self._active += 1
        try:
            return self.nodes.run(plan)
        finally:
            with self._lock:
                self._active -= 1

    def materialize(self, state_id: str, tokens: Sequence[int]) -> MaterializeResult:
        """Store ``tokens`` once as ``state_id`` (the task context root), prefilling only what
        this replica does not hold (:meth:`NodeRunner.materialize
        <graphflow.runtime.replica_nodes.NodeRunner.materialize>`)."""
        return self.nodes.materialize(state_id, tokens)

    def prefill_seconds(self, lengths: Sequence[int], repeats: int = 2) -> list[tuple[int, float]]:
        """Measured prefill times (the fastest of ``repeats``, after one warm-up) for calibration,
        on the thread that prefills when serving (the engine loop's, where there is one)."""
        from graphflow.runtime.calibration import prefill_samples

        if self.batcher is not None:
            return self.batcher.call(prefill_samples, self.engine, lengths, repeats)
        return prefill_samples(self.engine, lengths, repeats)

    def decode_seconds(self, points: Sequence[tuple[int, int]], steps: int = 3) -> list[tuple[int, int, float]]:
        """Measured engine-loop decode steps, ``(rows, context, seconds)`` per point (calibration's
        ``decode_samples``), on the loop's thread; none without an engine loop (requests then
        run one at a time and the policy leaves decode out)."""
        from graphflow.runtime.calibration import decode_samples

        if self.batcher is None:
            return []
        loop = self.batcher
        return loop.call(decode_samples, self.engine, points, self.config.block_tokens, steps, loop.padding)

    def cost_samples(self, lengths: Sequence[int], repeats: int = 2) -> dict[str, list[tuple[int, float]]]:
        """Measured (bytes, seconds) of rebuilding a cache from blocks (``resume``) and a
        template from base + residual (``reconstruct``), for the policy's costs."""
        from graphflow.runtime.calibration import reconstruct_samples, resume_samples

        return {
            "resume": resume_samples(self.engine, lengths, self.config.block_tokens, repeats),
            "reconstruct": reconstruct_samples(self.engine, repeats=repeats),
        }

    def max_positions(self) -> int:
        """The longest context this replica's model accepts (0: no stated limit)."""
        return self.nodes.max_positions()

    def kv_bytes_per_token(self) -> int:
        return self.engine.kv_bytes_per_token()

    def cancel_receive(self, transfer_id: int, why: str) -> None:
        """The sender of ``transfer_id`` failed: the node waiting for its blocks stops waiting now
        (``TransferAborted``) instead of at the transfer deadline."""
        self.transport.abort_recv(transfer_id, why)

    def inject_fault(self, fault: str) -> None:
        """Fault injection for ``graphflow check faults``: the next send misbehaves once
        (:meth:`Sends.inject_fault <graphflow.runtime.replica_sends.Sends.inject_fault>`)."""
        self.sends.inject_fault(fault, self._held)

    def send_blocks(self, tokens: Sequence[int], lo: int, peer: str, transfer_id: int) -> int:
        """Send the blocks of ``tokens[lo:]`` to ``peer``; returns bytes sent. Raises
        ``MissingBlocks`` if this store lost any."""
        return self.sends.send_blocks(tokens, lo, peer, transfer_id)

    def forget_peer(self, peer: str) -> bool:
        """Drop this replica's endpoint to the transport address ``peer`` (a replica that is gone)."""
        return self.transport.forget_peer(peer)

    def probe(self, peer: str, nbytes: int, transfer_id: int, send: bool) -> float:
        """One synthetic transfer of ``nbytes`` to or from ``peer``; the receiver's seconds."""
        return self.sends.probe(peer, nbytes, transfer_id, send)

    def report_waiting(self, apply: Callable[[list[EvictEvent]], object]) -> int:
        """Hand the evictions waiting for a result to ``apply`` (the manager's ``apply``; the
        actor calls this every few seconds, so a replica that gets no further call does not keep
        them); returns how many it handed over. Should ``apply`` raise, they wait again, first."""
        with self._lock:
            events = list(self.deliveries.take(self.store.has_block))
        if not events:
            return 0
        try:
            apply(events)
        except BaseException:
            with self._lock:
                self.deliveries.put_back(events)
            raise
        return len(events)

    def end_run(self, run_id: str, delivered: Collection[str]) -> None:
        """The executor finished ``run_id`` (or gave up on it), having delivered to the manager
        the results of the states ``delivered``: the states its ready nodes needed are no longer
        protected from eviction (each node's plan refreshes that table, and after a run's last
        launch nothing else would clear it); what the run's other results kept here is released,
        and a node of it still queued or running keeps nothing (``runtime.deliveries``)."""
        with self._lock:
            self._held.end_run(run_id)
            self.nodes.release_unread(self.deliveries.end_run(run_id, set(delivered)))

    def run_owners(self) -> set[str]:
        """The clients whose runs protect states here (the executors' ``Cluster.owner``)."""
        with self._lock:
            return self._held.run_owners()

    def end_runs_of(self, owners: Iterable[str]) -> list[str]:
        """``end_run`` for every run of ``owners``, clients that are gone (killed, disconnected)
        and so will never end them; returns the runs that ended."""
        with self._lock:
            ended = self._held.end_runs_of(owners)
            for run in ended:
                self.deliveries.forget(run)
            self.abandoned_runs += len(ended)
            return ended

    def release(self, state_id: str) -> int:
        """Drop ``state_id`` from this replica's store; returns the bytes freed. The manager hears
        of it with the replica's next result (``runtime.deliveries``). Raises ``ValueError`` for a
        state this replica does not keep."""
        with self._lock:
            if state_id not in self._held:
                raise ValueError(f"{self.config.name} keeps no state {state_id!r}; nothing released")
            before = self.store.used_bytes
            self.deliveries.wait([self.kept.evict(state_id)])
            return before - self.store.used_bytes

    def clear_kv(self) -> list[EvictEvent]:
        """Evict every kept state a ready node does not need now (the manager's events)."""
        return self.kept.clear()

    def info(self) -> ReplicaInfo:
        """How the manager registers this replica."""
        return ReplicaInfo(
            self.config.name,
            node=self.config.node or "localhost",
            device=self.config.device,
            budget_bytes=self.config.capacity_bytes,
            address=self.address(),
            transport=self.config.transport,
            host=self.config.host,
        )

    def holdings(self) -> list[AdmitEvent]:
        """Every state this replica holds, oldest first, as admits: a restarted manager
        re-learns the replica's contents from these."""
        return self.kept.holdings()

    def template_report(self) -> TemplateEvent:
        """What this replica can rebuild from base (+ residual) now (see ``TemplateHolding``), as
        the manager's event, stamped when taken (a restarted manager re-learns it from this)."""
        return self.nodes.template_report()

    def queue_length(self) -> int:
        """Node calls in this replica now (receiving, queued in the engine loop or running): what
        the executor's placement adds to each replica's score."""
        with self._lock:
            return self._active

    def memory(self, reset: bool = False) -> tuple[int, int]:
        """(resident, peak resident) bytes of this process; ``reset`` hands freed memory back to
        the OS and restarts the peak first (``graphflow bench serve`` measures peak growth)."""
        if reset:
            release_freed_memory()
            reset_peak_rss()
        return resident_bytes()

    def stats(self) -> ReplicaStats:
        s = self.store.stats()
        loop = self.batcher
        return ReplicaStats(
            replica=self.config.name,
            model=self.config.model,
            transport=self.config.transport,
            node=self.config.node or "localhost",
            host=self.config.host or "localhost",
            device=self.config.device,
            eviction=self.config.eviction,
            threads=self.threads,
            used_bytes=s.used_bytes,
            capacity_bytes=s.capacity_bytes,
            peak_bytes=s.peak_used_bytes,
            blocks=s.num_blocks,
            states=s.num_states,
            prefaulted_bytes=self.pool.prefaulted_bytes,
            prefault_short=self.pool.short,
            pool_bytes=self.pool.held_bytes,
            batching=loop is not None,
            batching_off=self.batching_off,
            max_batch_tokens=loop.max_batch_tokens if loop else 0,
            engine_steps=loop.steps if loop else 0,
            engine_rows=loop.rows_run if loop else 0,
            peak_rows=loop.peak_rows if loop else 0,
            engine_pauses=loop.pauses if loop else 0,
            queue=self.queue_length(),
            shared_prefix_copies=self.nodes.prefixes.built,
            protected_states=len(self._held.needed_now()),
            abandoned_runs=self.abandoned_runs,
            released_unread=self.deliveries.released,
            evictions_waiting=self.deliveries.waiting(),
            cpu_s=time.process_time(),
            engine_busy_s=loop.busy_s if loop else 0.0,
            padded_rows=tuple(sorted(loop.padding.padded.items())) if loop and loop.padding else (),
            linear_kernel=self.engine.linear_kernel,
            prefix_reading=self.prefix_reading,
            templates=self.templates.summary() if self.templates else TemplateStats(),
            routes=tuple(Route(peer, via) for peer, via in self.transport.routes().items()),
        )
