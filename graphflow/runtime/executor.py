"""Run a compiled workflow G_s on several replicas with the scheduler's decisions.

Per node: manager lookup (longest prefix everywhere) → ``scheduler.place`` over the replicas
(REUSE where the prefix is, TRANSFER from the best other replica, or RECOMPUTE) → the
replica runs it (the source replica sends blocks concurrently when transferring) → the
node's new state is registered with the manager. Ready nodes run concurrently.

The executor talks to replicas and the manager through a small :class:`Cluster` interface,
so it is the same plain class over Ray actors (``runtime.actors``) and over in-process
workers (unit tests).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from graphflow.kv.errors import MissingBlocks
from graphflow.runtime.errors import root_cause
from graphflow.runtime.replica import NodeResult, NodeRun
from graphflow.workflow.compile import ROOT, ExecGraph, node_context, node_path
from scheduler.cost import LinkSpec
from scheduler.policy import Decision, Option, Policy, RemoteCopy, StateRequest, place
from transport.base import transfer_ids
from transport.errors import TransportError

__all__ = ["FALLBACK", "Cluster", "NodeTrace", "RunResult", "WorkflowExecutor"]

FALLBACK = "fallback: "  # prefix of a decision's reason when a failure forced a recompute


class Cluster(Protocol):
    """What the executor needs from a deployment (Ray actors or in-process workers)."""

    replicas: list[str]

    def call(self, replica: str, method: str, *args: Any) -> Any: ...  # returns a handle
    def manager(self, method: str, *args: Any) -> Any: ...  # returns the value
    def wait_one(self, handles: Sequence[Any]) -> Any: ...  # a finished handle
    def get(self, handle: Any) -> Any: ...
    def is_replica_failure(self, exc: BaseException) -> bool: ...  # the replica itself is gone
    def drop_replica(self, replica: str) -> None: ...  # stop using it; the manager forgets its blocks


@dataclass(frozen=True, slots=True)
class NodeTrace:
    node: str
    replica: str
    decision: str
    source: str
    predicted_s: float
    measured_s: float
    ttft_s: float
    bytes_moved: int
    prefill_tokens: int
    prefill_tokens_saved: int
    context_tokens: int
    output: str
    note: str = ""  # why a fallback happened (a failed transfer, a lost replica), else ""
    rebuilt_tokens: int = 0  # template tokens the replica rebuilt from base + residual (not prefilled)


@dataclass(frozen=True, slots=True)
class RunResult:
    outputs: dict[str, tuple[int, ...]]
    texts: dict[str, str]
    final: str
    trace: tuple[NodeTrace, ...]
    decisions: tuple[Decision, ...] = field(default=(), compare=False)

    @property
    def bytes_moved(self) -> int:
        return sum(t.bytes_moved for t in self.trace)

    @property
    def prefill_tokens_saved(self) -> int:
        return sum(t.prefill_tokens_saved for t in self.trace)


class WorkflowExecutor:
    """Args: ``policy`` calibrated costs; ``link`` the measured replica-to-replica link."""

    _ids = transfer_ids()

    def __init__(self, cluster: Cluster, policy: Policy, link: LinkSpec, kv_bytes_per_token: int,
                 model_key: str, decode_steps: int = 16) -> None:  # fmt: skip
        if not cluster.replicas:
            raise ValueError("the cluster has no replicas")
        self.cluster = cluster
        self.policy = policy
        self.link = link
        self.bpt = kv_bytes_per_token
        self.model_key = model_key
        self.decode_steps = decode_steps
        self._cache: dict[str, list[int]] = {}

    def run(self, gs: ExecGraph, task_ids: Sequence[int], run_id: str, reuse: bool = True,
            on_node: Callable[[NodeTrace], None] | None = None) -> RunResult:  # fmt: skip
        """Execute ``gs`` for a task; ``reuse=False`` turns every KV reuse and transfer off.

        ``on_node`` is called with each node's trace as it finishes (progress reporting). A node
        whose replica dies or whose transfer fails is recomputed on a live replica; its trace
        says why (``note``). Bad requests raise ``ValueError``."""
        c = self.cluster
        if reuse:
            self._materialize_root(f"{run_id}:{ROOT}", task_ids)
        tokens: dict[str, list[int]] = {ROOT: list(task_ids)}
        results: dict[str, NodeResult] = {}
        outputs: dict[str, tuple[int, ...]] = {}
        traces: list[NodeTrace] = []
        decisions: list[Decision] = []
        in_flight: dict[Any, tuple[str, Decision, list[Any]]] = {}
        load = {r: 0 for r in c.replicas}
        transferring: set[str] = set()  # replicas with a transfer in flight
        retry: dict[str, str] = {}  # node → why its last attempt failed (it is recomputed)
        attempts: dict[str, int] = {}
        turn = itertools.count()
        while len(results) < len(gs.nodes):
            launched = {v[0] for v in in_flight.values()}
            for nid in gs.ready(set(results)):
                if nid in launched:
                    continue
                node = gs.node(nid)
                ctx = node_context(node, tokens, outputs, task_ids, self._encode)
                tokens[nid] = ctx
                if nid in retry:
                    d = self._recompute(ctx, min(c.replicas, key=lambda r: load[r]), retry[nid])
                elif reuse:
                    d = self._decide(ctx, load)
                else:
                    d = self._recompute(ctx, c.replicas[next(turn) % len(c.replicas)])
                if d.option is Option.TRANSFER and d.replica in transferring:
                    continue  # NOTE: wait for the transfer in flight; the prefix will then be local
                attempts[nid] = attempts.get(nid, 0) + 1
                try:
                    template = (node.role, node_path(gs, nid), len(self._encode(node.template)))
                    handles = self._launch(run_id, nid, ctx, d, reuse, node.preds, template)
                except Exception as exc:
                    if not c.is_replica_failure(exc):
                        raise
                    for r in {d.replica, d.source} - {""}:
                        if not self._alive(r):
                            self._lose(r)
                    continue  # decided again on the replicas that are left
                if d.option is Option.TRANSFER:
                    transferring.add(d.replica)
                in_flight[handles[0]] = (nid, d, handles)
                load[d.replica] += 1
            if not in_flight:
                continue
            done = c.wait_one(list(in_flight))
            nid, d, handles = in_flight.pop(done)
            load[d.replica] -= 1
            if d.option is Option.TRANSFER:
                transferring.discard(d.replica)
            try:
                res: NodeResult = c.get(done)
            except Exception as exc:
                retry[nid] = self._failed(exc, d, handles, attempts[nid])
                continue
            self._finish_sends(d, handles[1:])
            events = [*res.evicted, *([res.admit] if res.admit is not None else [])]
            if events and reuse and res.replica in c.replicas:  # a lost replica's KV is gone
                c.manager("apply", events, 0.0)
            results[nid] = res
            outputs[nid] = res.output_ids
            retry.pop(nid, None)
            decisions.append(d.with_measured(res.total_s))
            saved = res.reused_tokens + res.transferred_tokens
            traces.append(NodeTrace(nid, res.replica, d.option.value, d.source, d.chosen_predicted_s, res.total_s,
                                    res.ttft_s, res.bytes_moved, res.prefill_tokens, saved, len(tokens[nid]),
                                    res.text, d.reason if d.reason.startswith(FALLBACK) else "",
                                    res.rebuilt_tokens))  # fmt: skip
            if on_node is not None:
                on_node(traces[-1])
        final = gs.outputs[-1]
        return RunResult(
            outputs=outputs,
            texts={k: v.text for k, v in results.items()},
            final=results[final].text,
            trace=tuple(traces),
            decisions=tuple(decisions),
        )

    def _materialize_root(self, root: str, task_ids: Sequence[int]) -> None:
        c = self.cluster
        for replica in list(c.replicas):
            try:
                c.manager("apply", c.get(c.call(replica, "materialize", root, list(task_ids))), 0.0)
                return
            except Exception as exc:
                if not c.is_replica_failure(exc):
                    raise
                self._lose(replica)
        raise RuntimeError("every replica failed; restart the deployment (`graphflow serve`)")

    def _failed(self, exc: BaseException, d: Decision, handles: list[Any], tries: int) -> str:
        """A node attempt failed: decide whether to retry it (by recompute) and say why."""
        c = self.cluster
        if c.is_replica_failure(exc):
            self._lose(d.replica)
            why = f"replica {d.replica} lost"
        elif isinstance(exc, TransportError | MissingBlocks):
            why = f"transfer from {d.source} failed ({type(root_cause(exc)).__name__})"
        else:
            raise exc  # a bad request or a bug: the caller gets the error
        self._finish_sends(d, handles[1:])
        if tries > len(c.replicas) + 1:
            raise RuntimeError(f"node failed {tries} times, last because {why}") from exc
        return f"{FALLBACK}{why}; recomputed"

    def _finish_sends(self, d: Decision, sends: list[Any]) -> None:
        """Collect the source replica's send; a source that died meanwhile is dropped."""
        for h in sends:
            try:
                self.cluster.get(h)
            except Exception as exc:
                if self.cluster.is_replica_failure(exc):
                    self._lose(d.source)
                elif not isinstance(exc, TransportError | MissingBlocks):
                    raise

    def _alive(self, replica: str) -> bool:
        try:
            self.cluster.get(self.cluster.call(replica, "address"))
            return True
        except Exception as exc:
            if self.cluster.is_replica_failure(exc):
                return False
            raise

    def _lose(self, replica: str) -> None:
        if replica in self.cluster.replicas:
            self.cluster.drop_replica(replica)
        if not self.cluster.replicas:
            raise RuntimeError("every replica failed; restart the deployment (`graphflow serve`)")

    def _encode(self, text: str) -> list[int]:
        if text not in self._cache:
            self._cache[text] = self.cluster.get(self.cluster.call(self.cluster.replicas[0], "encode", text))
        return self._cache[text]

    def _decide(self, ctx: list[int], load: dict[str, int]) -> Decision:
        look = self.cluster.manager("begin_node", ctx, self.model_key, 0.0, 60.0)
        have = {m.replica: m.num_tokens for m in look.matches}
        requests = []
        for r in self.cluster.replicas:
            remote = tuple(RemoteCopy(o, n, self.link) for o, n in have.items() if o != r and n > have.get(r, 0))
            local = min(have.get(r, 0), len(ctx) - 1)
            requests.append(StateRequest(r, len(ctx), self.bpt, local_tokens=max(local, 0), remote=remote))
        queue = {r: n * self.policy.prefill(len(ctx)) for r, n in load.items()}
        return place(requests, queue, self.policy)

    def _recompute(self, ctx: list[int], replica: str, why: str = "reuse off") -> Decision:
        return Decision(Option.RECOMPUTE, replica, "", {Option.RECOMPUTE: self.policy.prefill(len(ctx))},
                        {Option.RECOMPUTE: 0.0}, {Option.RECOMPUTE: len(ctx) * self.bpt}, why)  # fmt: skip

    def _launch(self, run_id: str, nid: str, ctx: list[int], d: Decision, reuse: bool, preds: tuple[str, ...],
                template: tuple[str, tuple[str, ...], int]) -> list[Any]:  # fmt: skip
        c = self.cluster
        op, path, n_template = template
        run = NodeRun(f"{run_id}:{nid}", tuple(ctx), self.decode_steps, reuse=reuse,
                      parents=tuple(f"{run_id}:{p}" for p in preds) if reuse else (),
                      op=op, path=path, template_tokens=n_template)  # fmt: skip
        if d.option is not Option.TRANSFER:
            return [c.call(d.replica, "run_node", run)]
        tid = next(self._ids)
        src_addr = c.get(c.call(d.source, "address"))
        dst_addr = c.get(c.call(d.replica, "address"))
        n = max(m for o, m in self._holdings(ctx).items() if o == d.source)
        run = replace(run, reuse=True, transfer_from=src_addr, transfer_tokens=n, transfer_id=tid)
        send = c.call(d.source, "send_prefix", ctx, n, dst_addr, tid)
        return [c.call(d.replica, "run_node", run), send]

    def _holdings(self, ctx: list[int]) -> dict[str, int]:
        look = self.cluster.manager("begin_node", ctx, self.model_key, 0.0, 60.0)
        return {m.replica: m.num_tokens for m in look.matches}
