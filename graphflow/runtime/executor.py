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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from graphflow.runtime.replica import NodeResult, NodeRun
from graphflow.workflow.compile import ROOT, ExecGraph, node_context
from scheduler.cost import LinkSpec
from scheduler.policy import Decision, Option, Policy, RemoteCopy, StateRequest, place
from transport.base import transfer_ids

__all__ = ["Cluster", "NodeTrace", "RunResult", "WorkflowExecutor"]


class Cluster(Protocol):
    """What the executor needs from a deployment (Ray actors or in-process workers)."""

    replicas: list[str]

    def call(self, replica: str, method: str, *args: Any) -> Any: ...  # returns a handle
    def manager(self, method: str, *args: Any) -> Any: ...  # returns the value
    def wait_one(self, handles: Sequence[Any]) -> Any: ...  # a finished handle
    def get(self, handle: Any) -> Any: ...


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

    def run(self, gs: ExecGraph, task_ids: Sequence[int], run_id: str, reuse: bool = True) -> RunResult:
        """Execute ``gs`` for a task; ``reuse=False`` turns every KV reuse and transfer off."""
        c = self.cluster
        root = f"{run_id}:{ROOT}"
        if reuse:
            c.manager("apply", [c.get(c.call(c.replicas[0], "materialize", root, list(task_ids)))], 0.0)
        tokens: dict[str, list[int]] = {ROOT: list(task_ids)}
        results: dict[str, NodeResult] = {}
        traces: list[NodeTrace] = []
        decisions: list[Decision] = []
        in_flight: dict[Any, tuple[str, Decision, list[Any]]] = {}
        load = {r: 0 for r in c.replicas}
        transferring: set[str] = set()  # replicas with a transfer in flight
        rr = itertools.cycle(c.replicas)
        while len(results) < len(gs.nodes):
            launched = {v[0] for v in in_flight.values()}
            for nid in gs.ready(set(results)):
                if nid in launched:
                    continue
                node = gs.node(nid)
                outs = {k: v.output_ids for k, v in results.items()}
                ctx = node_context(node, tokens, outs, task_ids, self._encode)
                tokens[nid] = ctx
                d = self._decide(ctx, load) if reuse else self._recompute(ctx, next(rr))
                if d.option is Option.TRANSFER and d.replica in transferring:
                    continue  # NOTE: wait for the transfer in flight; the prefix will then be local
                if d.option is Option.TRANSFER:
                    transferring.add(d.replica)
                handles = self._launch(run_id, nid, ctx, d, reuse, node.preds)
                in_flight[handles[0]] = (nid, d, handles)
                load[d.replica] += 1
            done = c.wait_one(list(in_flight))
            nid, d, handles = in_flight.pop(done)
            for h in handles[1:]:
                c.get(h)  # the source replica's send
            res: NodeResult = c.get(done)
            load[d.replica] -= 1
            if d.option is Option.TRANSFER:
                transferring.discard(d.replica)
            if res.admit is not None and reuse:
                c.manager("apply", [res.admit], 0.0)
            results[nid] = res
            decisions.append(d.with_measured(res.total_s))
            saved = res.reused_tokens + res.transferred_tokens
            traces.append(NodeTrace(nid, res.replica, d.option.value, d.source, d.chosen_predicted_s, res.total_s,
                                    res.ttft_s, res.bytes_moved, res.prefill_tokens, saved, len(tokens[nid]),
                                    res.text))  # fmt: skip
        final = gs.outputs[-1]
        return RunResult(
            outputs={k: v.output_ids for k, v in results.items()},
            texts={k: v.text for k, v in results.items()},
            final=results[final].text,
            trace=tuple(traces),
            decisions=tuple(decisions),
        )

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

    def _recompute(self, ctx: list[int], replica: str) -> Decision:
        return Decision(Option.RECOMPUTE, replica, "", {Option.RECOMPUTE: self.policy.prefill(len(ctx))},
                        {Option.RECOMPUTE: 0.0}, {Option.RECOMPUTE: len(ctx) * self.bpt}, "reuse off")  # fmt: skip

    def _launch(
        self, run_id: str, nid: str, ctx: list[int], d: Decision, reuse: bool, preds: tuple[str, ...]
    ) -> list[Any]:
        c = self.cluster
        run = NodeRun(f"{run_id}:{nid}", tuple(ctx), self.decode_steps, reuse=reuse,
                      parents=tuple(f"{run_id}:{p}" for p in preds) if reuse else ())  # fmt: skip
        if d.option is not Option.TRANSFER:
            return [c.call(d.replica, "run_node", run)]
        tid = next(self._ids)
        src_addr = c.get(c.call(d.source, "address"))
        dst_addr = c.get(c.call(d.replica, "address"))
        n = max(m for o, m in self._holdings(ctx).items() if o == d.source)
        run = NodeRun(run.state_id, run.tokens, run.decode_steps, True, src_addr, n, tid, run.parents)
        send = c.call(d.source, "send_prefix", ctx, n, dst_addr, tid)
        return [c.call(d.replica, "run_node", run), send]

    def _holdings(self, ctx: list[int]) -> dict[str, int]:
        look = self.cluster.manager("begin_node", ctx, self.model_key, 0.0, 60.0)
        return {m.replica: m.num_tokens for m in look.matches}
