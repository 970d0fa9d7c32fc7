"""Run a compiled workflow G_s on several replicas with the scheduler's decisions.

Per run: the task root is materialized once (a trace row of its own). Per ready node:

```
context tokens, hashed once ─► manager.begin_node(keys, template, now)   one round trip
   ─► scheduler.place(...) ─► Decision (reuse / transfer / reconstruct / recompute, replica,
                                        local prefix, range to receive, residual to apply)
   ─► NodePlan ─► replica.run_node   (the source replica sends the missing blocks meanwhile)
   ─► manager.apply(admits, evictions, template holdings, now)
```

Ready nodes run concurrently. A node whose replica dies or whose transfer fails is recomputed
on a live replica; the decision's ``fallback`` says why. The executor talks to replicas and
the manager through a small :class:`Cluster` interface, so it is the same plain class over Ray
actors (``runtime.actors``) and over in-process workers (unit tests). Times come from an
injected ``clock`` (seconds; the manager's catalog stores them relative to its epoch).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from graphflow.kv.differential.modes import base_version
from graphflow.kv.events import ReplicaInfo
from graphflow.kv.state_index import run_of
from graphflow.runtime.cluster_api import Cluster
from graphflow.runtime.errors import Unavailable
from graphflow.runtime.failures import ALL_LOST, Failures
from graphflow.runtime.in_flight import InFlight, prefix_key
from graphflow.runtime.offers import arriving_tokens, state_requests
from graphflow.runtime.order import levels, next_use
from graphflow.runtime.plan import MaterializeResult, NodePlan, NodeResult, TemplateRef
from graphflow.runtime.run_state import Deadline, Flight, RunState
from graphflow.runtime.trace import MATERIALIZE, NodeTrace, RunResult, node_trace
from graphflow.workflow.compile import ROOT, ExecGraph, node_context, node_path
from scheduler.cost import LinkMatrix, LinkSpec
from scheduler.decode import decode_s, send_delay_s, shared_tokens
from scheduler.policy import (
    Decision,
    Option,
    Policy,
    place,
    prefill_work_s,
    recompute,
)
from transport.ids import transfer_ids

__all__ = ["Cluster", "WorkflowExecutor"]


class WorkflowExecutor:
    """Args: ``policy`` calibrated costs; ``links`` the measured replica-to-replica links (one
    ``LinkSpec`` stands for every pair); ``clock`` seconds for the manager's timestamps."""

    _ids = transfer_ids()

    def __init__(
        self,
        cluster: Cluster,
        policy: Policy,
        links: LinkMatrix | LinkSpec,
        kv_bytes_per_token: int,
        model_key: str,
        decode_steps: int = 16,
        clock: Callable[[], float] = time.time,
        block_tokens: int = 16,
        lease_s: float = 60.0,
    ) -> None:
        if not cluster.replicas:
            raise ValueError("the cluster has no replicas")
        self.cluster = cluster
        self.policy = policy
        self.links = links if isinstance(links, LinkMatrix) else LinkMatrix.uniform(links)
        self.bpt = kv_bytes_per_token
        self.model_key = model_key
        self.decode_steps = decode_steps
        self.clock = clock
        self.block_tokens = block_tokens
        self.lease_s = lease_s
        self._cache: dict[str, list[int]] = {}
        self._info: dict[str, ReplicaInfo] = {}
        self.failures = Failures(cluster)
        self.in_flight = InFlight()  # every run's nodes in flight: the load placement prices
        self._delivered: dict[str, set[str]] = {}  # run → states whose results reached the manager

    def run(
        self,
        gs: ExecGraph,
        task_ids: Sequence[int],
        run_id: str,
        reuse: bool = True,
        on_node: Callable[[NodeTrace], None] | None = None,
        pin: Mapping[str, str] | None = None,
        force: Option | None = None,
        transfers: bool = True,
        timeout_s: float | None = None,
        since: float | None = None,
    ) -> RunResult:
        """Execute ``gs`` for a task; ``reuse=False`` turns every KV reuse and transfer off.

        ``on_node`` is called with each node's trace as it finishes (progress reporting).
        ``pin`` maps node ids (and ``ROOT``, the task context's materialization) to the replica
        they must run on; the scheduler still chooses how their KV gets there. A node whose
        replica dies or whose transfer fails is recomputed on a live replica (a lost pinned
        replica included); its trace says why (``note``). ``force`` makes every node take that
        option where it can (an ablation; sweeps measure each option this way); the decisions
        (``RunResult.decisions``) still price every option. ``transfers=False`` never moves KV
        between replicas: each replica reuses only its own prefixes, as per-replica prefix
        caching does (the baseline serving stacks give). Bad requests raise ``ValueError``.
        ``timeout_s`` bounds the wait for the run's results, counted from ``since`` (a
        ``time.monotonic()``; default now): past it, ``RunTimeout`` (the nodes
        still running on replicas finish there and keep nothing; their evictions reach the
        manager with the replica's next result).

        However the run ends, every replica is told so (``end_run``, with the states whose
        results reached the manager): the states it protected for this run's ready nodes are
        evictable again, and what results nobody collected kept is released. The manager learns
        the run's client when it begins (``begin_run``), so a run whose client dies mid-run is
        ended all the same."""
        deadline = Deadline(timeout_s, len(gs.nodes), time.monotonic() if since is None else since)
        try:
            if self.cluster.owner:
                self.cluster.manager("begin_run", run_id, self.cluster.owner)
            return self._run(gs, task_ids, run_id, reuse, on_node, pin, force, transfers, deadline)
        finally:
            self.in_flight.end_run(run_id)
            self._end_run(run_id)

    def _run(
        self,
        gs: ExecGraph,
        task_ids: Sequence[int],
        run_id: str,
        reuse: bool,
        on_node: Callable[[NodeTrace], None] | None,
        pin: Mapping[str, str] | None,
        force: Option | None,
        transfers: bool,
        deadline: Deadline,
    ) -> RunResult:
        c = self.cluster
        pin = dict(pin or {})
        self._check_pin(gs, pin)
        st = RunState(run_id, list(task_ids), list(c.replicas), reuse, pin, force, transfers)
        self._refresh_info()
        if reuse:
            st.traces.append(self.materialize_root(f"{run_id}:{ROOT}", task_ids, pin.get(ROOT, ""), deadline))
        st.tokens[ROOT] = list(task_ids)
        level = levels(gs)
        while len(st.results) < len(gs.nodes):
            launched = st.launched()
            ready = gs.ready(set(st.results))
            for nid in ready:
                if nid not in launched:
                    self._start(st, gs, nid, ready, level)
            if not st.in_flight:
                continue
            done = c.wait_one([*st.in_flight, *st.sending], deadline.left())
            if done is None:
                raise deadline.passed(len(st.results))
            if done in st.sending:
                self.failures.sent(done, *st.sending.pop(done))
            else:
                self._collect(st, done, on_node)
        return st.result(gs.outputs[-1])

    def _start(self, st: RunState, gs: ExecGraph, nid: str, ready: Sequence[str], level: dict[str, int]) -> None:
        """Decide ready node ``nid`` and launch it (a transfer into a replica another transfer
        is filling, or a launch that finds a replica gone, is left to the next round)."""
        c = self.cluster
        node = gs.node(nid)
        t0 = time.perf_counter()
        ctx = node_context(node, st.tokens, st.outputs, st.task_ids, self._encode)
        st.tokens[nid] = ctx
        tmpl = TemplateRef(node.role, node_path(gs, nid), len(self._encode(node.template)))
        pinned = st.pin.get(nid, "")
        if pinned not in c.replicas:  # unpinned, or pinned to a replica since lost: no longer binds
            pinned = ""
        arriving = arriving_tokens(ctx, st.transferring) if st.reuse else {}
        d = self._choose(st, nid, ctx, tmpl, pinned, arriving)
        if d.option is Option.TRANSFER and d.replica in st.transferring:
            return  # NOTE: another prefix is moving there; once it has, this one is decided again
        awaits = arriving.get(d.replica, 0) if d.option in (Option.REUSE, Option.RECONSTRUCT) else 0
        awaits = awaits if d.local_tokens >= awaits else 0
        st.attempts[nid] = st.attempts.get(nid, 0) + 1
        kept = tuple(p for p in node.preds if st.results[p].admit is not None)  # lineage: states that exist
        soon = next_use(gs, set(st.results), ready, st.run_id, level) if st.reuse else ()
        plan = self._plan(st.run_id, nid, ctx, d, st.reuse, kept, tmpl, soon, awaits)
        try:
            handles = self._launch(plan, d, ctx)
        except Exception as exc:
            if not c.is_replica_failure(exc):
                raise
            for r in {d.replica, d.source} - {""}:
                if not self.failures.alive(r):
                    self.failures.lose(r)
            return  # decided again on the replicas that are left
        st.started(Flight(nid, d, handles, t0, time.perf_counter() - t0), ctx, plan.transfer_id)
        self.in_flight.add(
            st.run_id, nid, d.replica, prefix_key(ctx, shared_tokens(d)), len(ctx), prefill_work_s(d, self.policy)
        )

    def _choose(
        self,
        st: RunState,
        nid: str,
        ctx: list[int],
        tmpl: TemplateRef,
        pinned: str,
        arriving: Mapping[str, int],
    ) -> Decision:
        """The scheduler's decision for ``nid``; a retried node, or any with reuse off, recomputes."""
        c = self.cluster
        if nid in st.retry:
            where = pinned or min(c.replicas, key=lambda r: st.load[r])
            return recompute(where, len(ctx), self.bpt, self.policy, st.retry[nid], fallback=st.retry[nid])
        if st.reuse:
            return self._decide(ctx, tmpl, pinned, st.force, st.transfers, arriving)
        where = pinned or c.replicas[next(st.turn) % len(c.replicas)]
        return recompute(where, len(ctx), self.bpt, self.policy, "reuse off")

    def _collect(self, st: RunState, done: Any, on_node: Callable[[NodeTrace], None] | None) -> None:
        """A node call finished: report its result to the manager and record it, or, when it
        failed, mark the node for recompute."""
        c = self.cluster
        flight = st.landed(done)
        nid, d = flight.node, flight.decision
        self.in_flight.remove(st.run_id, nid)
        try:
            res: NodeResult = c.get(done)
        except Exception as exc:
            st.retry[nid] = self.failures.failed(exc, d, flight.handles, st.attempts[nid])
            return
        self.failures.finish_sends(d, flight.handles[1:])
        if st.reuse and res.replica in c.replicas:  # a lost replica's KV is gone
            self._report(res)
        latency = time.perf_counter() - flight.t0
        st.done(flight, res, node_trace(nid, d, res, len(st.tokens[nid]), flight.decide_s, latency))
        if on_node is not None:
            on_node(st.traces[-1])

    # ---- one node ------------------------------------------------------------------------
    def _decide(
        self,
        ctx: list[int],
        tmpl: TemplateRef,
        pinned: str = "",
        force: Option | None = None,
        transfers: bool = True,
        arriving: Mapping[str, int] | None = None,
    ) -> Decision:
        """One manager round trip, then the policy over every replica (only ``pinned``, if set;
        without ``transfers``, other replicas' copies are not offered). ``arriving``: leading
        context tokens a transfer in flight is bringing to a replica, offered as local there (the
        node waits for them to land: ``NodePlan.await_tokens``)."""
        version = base_version(self.model_key, ctx[len(ctx) - tmpl.tokens :]) if tmpl.tokens else ""
        look = self.cluster.manager(
            "begin_node", ctx, self.model_key, self.clock(), self.lease_s, None, (tmpl.op, tmpl.path, version)
        )
        everyone = list(self.cluster.replicas)
        requests = state_requests(
            look,
            len(ctx),
            tmpl,
            [pinned] if pinned else everyone,
            everyone,
            self.block_tokens,
            self.bpt,
            self.links.link,
            self._address,
            transfers,
            arriving,
        )
        # NOTE: the replicas count every client's nodes; this client's own launches may not have arrived
        # yet, and what those prefill and read is known here (every run's nodes, each shared prefix once)
        reported = self.cluster.queue_lengths()
        queue = self.in_flight.queue_s(everyone, reported, self.policy.prefill(len(ctx)))
        decode = self.policy.decode
        if decode is None:
            return place(requests, queue, self.policy, force)
        batches = self.in_flight.batches(everyone, reported, len(ctx))
        busy = {r: b.rows for r, b in batches.items()}

        def extra(d: Decision) -> float:
            prefix = prefix_key(ctx, shared_tokens(d))
            added = decode_s(decode, d.replica, batches, self.decode_steps, len(ctx), prefix)
            return added + send_delay_s(d, busy, self.bpt, self.links)

        return place(requests, queue, self.policy, force, extra)

    def _plan(
        self,
        run_id: str,
        nid: str,
        ctx: list[int],
        d: Decision,
        reuse: bool,
        preds: tuple[str, ...],
        tmpl: TemplateRef,
        soon: tuple[tuple[str, int], ...],
        awaits: int = 0,
    ) -> NodePlan:
        transfer = d.option is Option.TRANSFER
        return NodePlan(
            state_id=f"{run_id}:{nid}",
            tokens=tuple(ctx),
            decode_steps=self.decode_steps,
            option=d.option,
            keep=reuse,
            local_tokens=d.local_tokens,
            receive=d.receive,
            source_address=d.source_address if transfer else "",
            transfer_id=next(self._ids) if transfer else 0,
            parents=tuple(f"{run_id}:{p}" for p in preds) if reuse else (),
            template=tmpl,
            next_use=soon,
            await_tokens=awaits,
            owner=self.cluster.owner,
        )

    def _launch(self, plan: NodePlan, d: Decision, ctx: list[int]) -> list[Any]:
        c = self.cluster
        if d.option is not Option.TRANSFER:
            return [c.call(d.replica, "run_node", plan)]
        lo, hi = plan.receive
        send = c.call(d.source, "send_blocks", ctx[:hi], lo, self._address(d.replica), plan.transfer_id)
        return [c.call(d.replica, "run_node", plan), send]

    def _report(self, res: NodeResult) -> None:
        self.cluster.manager("apply", res.manager_events(), self.clock())
        self._applied(res.state_id)

    def _applied(self, state_id: str) -> None:
        """The result of ``state_id`` reached the manager (its run's ``end_run`` says so)."""
        run = run_of(state_id)
        if run:
            self._delivered.setdefault(run, set()).add(state_id)

    def materialize_root(
        self, root: str, task_ids: Sequence[int], pinned: str = "", deadline: Deadline | None = None
    ) -> NodeTrace:
        """Prefill the task context once as state ``root``, on ``pinned`` if set (else the first
        live replica); blocks the replica already holds are reused (a context computed upstream)."""
        c = self.cluster
        deadline = deadline or Deadline(None, 0)
        for replica in sorted(c.replicas, key=lambda r: r != pinned):
            try:
                got: MaterializeResult = deadline.result(c, c.call(replica, "materialize", root, list(task_ids)))
            except Exception as exc:
                if not c.is_replica_failure(exc):
                    raise
                self.failures.lose(replica)
                continue
            c.manager("apply", list(got.events), self.clock())
            self._applied(root)
            note = "" if got.kept else "larger than the replica's store: not kept, nodes prefill it"
            n = got.tokens - got.reused
            return NodeTrace(
                ROOT,
                replica,
                MATERIALIZE,
                "",
                self.policy.prefill(n),
                got.seconds,
                got.seconds,
                0,
                n,
                got.reused,
                got.tokens,
                "",
                note,
            )
        raise Unavailable(ALL_LOST)

    def _end_run(self, run_id: str) -> None:
        """Tell every live replica the run is over and which of its results reached the manager
        (a lost one is dropped, as anywhere else), and the manager, which forgets the run's state
        records a while later."""
        self.failures.tell_all("end_run", run_id, sorted(self._delivered.pop(run_id, ())))
        self.cluster.manager("end_run", run_id, self.clock())

    # ---- helpers -------------------------------------------------------------------------
    def _check_pin(self, gs: ExecGraph, pin: Mapping[str, str]) -> None:
        nodes = {n.id for n in gs.nodes} | {ROOT}
        for nid, replica in pin.items():
            if nid not in nodes:
                known = ", ".join(sorted(nodes))
                raise ValueError(f"cannot pin {nid!r}: the workflow has no such node (it has {known})")
            if replica not in self.cluster.replicas:
                raise ValueError(
                    f"cannot pin {nid!r} to {replica!r}: the deployment's replicas are "
                    f"{', '.join(self.cluster.replicas)}"
                )

    def _refresh_info(self) -> None:
        """Transport addresses and nodes as the manager has them (one call per run)."""
        self._info = {i.name: i for i in self.cluster.manager("list_replicas")}

    def _address(self, replica: str) -> str:
        info = self._info.get(replica)
        if info is None or not info.address:
            raise ValueError(f"the manager has no transport address for {replica}; restart the deployment")
        return info.address

    def _encode(self, text: str) -> list[int]:
        if text not in self._cache:
            self._cache[text] = self.cluster.get(self.cluster.call(self.cluster.replicas[0], "encode", text))
        return self._cache[text]
