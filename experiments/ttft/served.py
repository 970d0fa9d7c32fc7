"""TTFT through the served path: an agent pinned to the replica that does not hold its context.

An embedded deployment (``graphflow.connect()``: Ray actors, the KV manager, UCX between the
replicas) of two replicas; the runs are ``graphflow.bench.served.PinnedAgent``'s: per context
length and repeat, the context is materialized on ``replica-0``, the agent is pinned to
``replica-1``, and the scheduler decides how its KV gets there (at these sizes: a transfer of
the upstream blocks over UCX). Per node the executor's trace gives
(``runtime.executor.NodeTrace``):

* ``served`` — ``first_token_s``: from the executor deciding the node (hashing, the manager
  round trip, placement) to the replica's first token, Ray calls both ways included;
* ``served_replica`` — the replica's own ``ttft_s``: from its call starting to its first token
  (receive, cache rebuild, the suffix's prefill);
* ``served_dense`` — the same node with reuse off on the same replica (everything prefilled);
* ``served_{lookup,receive,rebuild,prefill}`` — the replica-side time split into its phases
  (``NodeTrace.phases``): the store lookup, the UCX receive, the cache rebuild from the received
  blocks, the suffix's prefill to the first token.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from graphflow.bench.served import PinnedAgent
from graphflow.client import connect

__all__ = ["served_rows"]

HOLDER, AGENT = "graphflow-replica-0", "graphflow-replica-1"
FIRST_TOKEN_PHASES = ("lookup", "receive", "rebuild", "prefill")  # the replica's phases up to its first token


def served_rows(
    model: str,
    contexts: list[int],
    repeats: int,
    threads: int,
    capacity_mib: int,
    suffix: int,
    say: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Median served TTFTs per context (after one warm-up), and what the deployment was;
    contexts the model cannot hold (``max_position_embeddings``) are left out. The agent's
    prompt is cut to ``suffix`` of the model's tokens; ``say`` hears each context as it starts."""
    client = connect(
        None,
        model=model,
        replicas=2,
        decode_steps=1,
        threads=threads,
        capacity_mib=capacity_mib,
        prefault_mib=capacity_mib,
    )
    try:
        agent = PinnedAgent(client, prompt_tokens=suffix)
        stats = {s.replica: s for s in client.status()}
        limit = client.cluster.get(client.cluster.call(AGENT, "max_positions"))
        rows = []
        for n in contexts:
            if limit and n + suffix + 1 > limit:
                say(f"{model}: {n}-token context skipped ({n + suffix + 1} positions, the model holds {limit})")
                continue  # the model cannot hold this context (and the agent's suffix)
            say(f"{model}: served, {n}-token context, {repeats}× each after a warm-up (reuse, then dense)")
            parts: dict[str, list[float]] = {
                "served": [],
                "served_replica": [],
                "served_decide": [],
                "served_dense": [],
                **{f"served_{phase}": [] for phase in FIRST_TOKEN_PHASES},
            }
            decisions, moved, same = set(), set(), []
            for r in range(repeats + 1):
                context = agent.context(n)  # both runs read the same tokens: their first tokens compare
                on, off = agent.run(n, AGENT, holder=HOLDER, context=context), agent.run(n, AGENT, context=context)
                decisions.add(on.trace.decision)
                moved.add(on.trace.bytes_moved)
                same.append(on.first_token == off.first_token)
                if r:
                    parts["served"].append(on.trace.first_token_s)
                    parts["served_replica"].append(on.trace.ttft_s)
                    parts["served_decide"].append(on.trace.decide_s)
                    parts["served_dense"].append(off.trace.first_token_s)
                    for phase, s in on.trace.phases:
                        if phase in FIRST_TOKEN_PHASES:
                            parts[f"served_{phase}"].append(s)
            rows.append(
                {
                    "context": n,
                    "suffix": on.trace.context_tokens - n,
                    "decision": "+".join(sorted(decisions)),
                    "served_bytes": max(moved),
                    "served_same_first_token": all(same),
                    # a phase that never ran (no receive on a reuse) took no time
                    **{f"{k}_s": statistics.median(v) if v else 0.0 for k, v in parts.items()},
                }
            )
        return {
            "rows": rows,
            "threads": {r: s.threads for r, s in stats.items()},
            "prefaulted_bytes": {r: s.prefaulted_bytes for r, s in stats.items()},
            "link_bandwidth_bytes_per_s": client.executor.links.link(HOLDER, AGENT).bandwidth_bytes_per_s,
            "transport": stats[AGENT].transport,
        }
    finally:
        client.cluster.shutdown()
