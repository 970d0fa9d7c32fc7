"""TTFT through the served path: an agent pinned to the replica that does not hold its context.

An embedded deployment (``graphflow.connect()``: Ray actors, the KV manager, UCX between the
replicas) of two replicas. Per context length and repeat, one workflow run of a single agent
node over an upstream context of ``L`` tokens: the context is materialized on ``replica-0``
(pinned), the agent is pinned to ``replica-1``, and the scheduler decides how its KV gets there
(at these sizes: a transfer of the upstream blocks over UCX). Every repeat uses an upstream
context of its own (shifted by whole blocks), so no replica holds it already.

Per node the executor's trace gives (see ``runtime.executor.NodeTrace``):

* ``served`` — ``first_token_s``: from the executor deciding the node (hashing, the manager
  round trip, placement) to the replica's first token, Ray calls both ways included;
* ``served_replica`` — the replica's own ``ttft_s``: from its call starting to its first token
  (receive, cache rebuild, the suffix's prefill);
* ``served_dense`` — the same node with reuse off on the same replica (everything prefilled).
"""

from __future__ import annotations

import statistics
from typing import Any

from graphflow.client import connect, new_run_id
from graphflow.models.prompts import prompt_token_ids
from graphflow.workflow.compile import ROOT, ExecGraph, ExecNode

__all__ = ["AGENT_TEXT", "served_rows"]

AGENT_TEXT = "\nNext agent: check the reasoning above and give the final answer as a number.\n" * 4
HOLDER, AGENT = "graphflow-replica-0", "graphflow-replica-1"


class _ReplicaTokenizer:
    """The served model's tokenizer, asked through a replica (the study loads no model itself)."""

    def __init__(self, client: Any) -> None:
        self.cluster = client.cluster

    def encode(self, text: str) -> list[int]:
        return list(self.cluster.get(self.cluster.call(self.cluster.replicas[0], "encode", text)))


def _graph() -> ExecGraph:
    node = ExecNode("agent", "Custom", "REVIEW", AGENT_TEXT, (), ROOT)
    return ExecGraph((node,), (), ((ROOT, "agent"),), ("agent",))


def served_rows(model: str, contexts: list[int], repeats: int, threads: int, capacity_mib: int) -> dict[str, Any]:
    """Median served TTFTs per context (after one warm-up), and what the deployment was."""
    client = connect(None, model=model, replicas=2, decode_steps=1, threads=threads, capacity_mib=capacity_mib,
                     prefault_mib=capacity_mib)  # fmt: skip
    try:
        tokenizer = _ReplicaTokenizer(client)
        gs, shift = _graph(), 0
        stats = {s["replica"]: s for s in client.status()}
        rows = []
        for n in contexts:
            parts: dict[str, list[float]] = {"served": [], "served_replica": [], "served_decide": [],
                                             "served_dense": []}  # fmt: skip
            decisions, moved, firsts = set(), set(), set()
            for r in range(repeats + 1):
                shift += 16  # NOTE: whole blocks, so every repeat's chain of block keys is new
                upstream = prompt_token_ids(tokenizer, n + shift)[shift:]
                on = client.executor.run(gs, upstream, new_run_id(), pin={ROOT: HOLDER, "agent": AGENT})
                off = client.executor.run(gs, upstream, new_run_id(), reuse=False, pin={"agent": AGENT})
                node, dense = on.nodes[0], off.nodes[0]
                decisions.add(node.decision)
                moved.add(node.bytes_moved)
                firsts.add((on.outputs["agent"][0], off.outputs["agent"][0]))
                if r:
                    for k, v in (("served", node.first_token_s), ("served_replica", node.ttft_s),
                                 ("served_decide", node.decide_s), ("served_dense", dense.first_token_s)):  # fmt: skip
                        parts[k].append(v)
            rows.append({"context": n, "suffix": node.context_tokens - n, "decision": "+".join(sorted(decisions)),
                         "served_bytes": max(moved), "served_same_first_token": all(a == b for a, b in firsts),
                         **{f"{k}_s": statistics.median(v) for k, v in parts.items()}})  # fmt: skip
        return {
            "rows": rows,
            "threads": {r: s["threads"] for r, s in stats.items()},
            "prefaulted_bytes": {r: s["prefaulted_bytes"] for r, s in stats.items()},
            "link_bandwidth_bytes_per_s": client.executor.links.link(HOLDER, AGENT).bandwidth_bytes_per_s,
            "transport": stats[AGENT]["transport"],
        }
    finally:
        client.cluster.shutdown()
