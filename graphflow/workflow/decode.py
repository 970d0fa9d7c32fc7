"""Greedy decoding of a workflow from edge scores; validity check.

Candidates are the wGraph's edges plus ``TASK → op`` start edges for depth-0 operations.

1. Start: every start edge scoring ≥ τ; if none, the best one.
2. Grow: repeatedly take the best-scoring wGraph edge leaving a chosen operation that scores
   ≥ τ, adding its target. Stop when none is left.

Every result is legal (wGraph edges only), acyclic (a subgraph of a DAG), connected (each
node was reached from a start), and has outputs (its sinks) — so ``validity`` is 1 by
construction, and :func:`is_valid` checks it independently.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from graphflow.workflow.corpus import Workflow
from graphflow.workflow.wgraph import WGraph

__all__ = ["Candidates", "decode", "is_valid"]


class Candidates:
    """Candidate edges of a wGraph as a ``[2, C]`` tensor (task node id = ``len(ops)``)."""

    def __init__(self, g: WGraph) -> None:
        self.g = g
        self.task = len(g.ops)
        self.starts = g.sources()
        pairs = [(self.task, s) for s in self.starts] + list(g.edges)
        self.pairs = pairs
        self.index = torch.tensor(pairs, dtype=torch.long).t().contiguous()
        self.wgraph_index = (
            torch.tensor(g.edges, dtype=torch.long).t().contiguous() if g.edges else torch.zeros(2, 0, dtype=torch.long)
        )

    def __len__(self) -> int:
        return len(self.pairs)


def decode(
    cands: Candidates,
    scores: torch.Tensor,
    threshold: float = 0.5,
    pick: Callable[[int, float], bool] | None = None,
    fallback: Callable[[list[float]], int] | None = None,
) -> tuple[list[int], list[tuple[int, int]], list[int]]:
    """Returns ``(nodes, edges, chosen candidate indices)``.

    ``pick(i, p)`` overrides the threshold test and ``fallback(start scores)`` the choice of the
    best start when no start passes it (REINFORCE samples with both)."""
    take = pick or (lambda _i, p: p >= threshold)
    s = scores.tolist()
    n_start = len(cands.starts)
    chosen = [i for i in range(n_start) if take(i, s[i])]
    if not chosen:
        chosen = [fallback(s[:n_start]) if fallback else max(range(n_start), key=lambda i: s[i])]
    nodes = [cands.pairs[i][1] for i in chosen]
    in_set = set(nodes)
    edges: list[tuple[int, int]] = []
    considered: set[int] = set()
    while True:
        frontier = [i for i in range(n_start, len(cands)) if i not in considered and cands.pairs[i][0] in in_set]
        if not frontier:
            break
        best = max(frontier, key=lambda i: s[i])
        considered.add(best)
        if take(best, s[best]):
            chosen.append(best)
            u, v = cands.pairs[best]
            edges.append((u, v))
            if v not in in_set:
                in_set.add(v)
                nodes.append(v)
    return nodes, edges, chosen


def is_valid(w: Workflow) -> bool:
    """Non-empty, acyclic, every node reachable from a source, at least one output."""
    ids = [n.id for n in w.nodes]
    if not ids or not w.outputs:
        return False
    has_in = {d for _, d in w.edges}
    seen = [i for i in ids if i not in has_in]
    frontier = list(seen)
    while frontier:
        u = frontier.pop()
        for s, d in w.edges:
            if s == u and d not in seen:
                seen.append(d)
                frontier.append(d)
    return len(set(seen)) == len(ids)  # Workflow's constructor already refuses cycles
