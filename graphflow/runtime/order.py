"""Topological order of a compiled workflow: each node's level, and how soon each kept state
is needed again (what eviction protects)."""

from __future__ import annotations

from collections.abc import Sequence

from graphflow.workflow.compile import ExecGraph

__all__ = ["levels", "next_use"]


def levels(gs: ExecGraph) -> dict[str, int]:
    """Each node's topological level (0: no predecessors)."""
    level: dict[str, int] = {}
    for n in gs.nodes:  # topological order
        level[n.id] = 1 + max((level[p] for p in n.preds), default=-1)
    return level


def next_use(
    gs: ExecGraph, done: set[str], ready: Sequence[str], run_id: str, level: dict[str, int] | None = None
) -> tuple[tuple[str, int], ...]:
    """For each state the unfinished nodes extend, the topological steps until one needs it
    (0: a node that is ready now). Nodes of ``ready`` count 0. ``level``: :func:`levels` of
    ``gs``, when the caller has it."""
    level = level if level is not None else levels(gs)
    left = [n for n in gs.nodes if n.id not in done]
    if not left:
        return ()
    floor = min(level[n.id] for n in left)
    out: dict[str, int] = {}
    for n in left:
        sid = f"{run_id}:{n.state_parent}"
        steps = 0 if n.id in ready else level[n.id] - floor
        out[sid] = min(steps, out.get(sid, steps))
    return tuple(sorted(out.items()))
