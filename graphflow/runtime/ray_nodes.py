"""Which Ray nodes a deployment places its actors on: the alive nodes in the order ``--spread``
fills them, what each reports of a resource, and a strategy that pins an actor to one."""

from __future__ import annotations

from typing import Any

from graphflow.runtime.errors import Unavailable

__all__ = ["node_resource", "on_node", "spread_nodes"]


def spread_nodes(ray: Any) -> list[str]:
    """Alive Ray node ids, the head first, then by address (the order ``spread`` fills)."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    if not alive:
        raise Unavailable("the Ray cluster reports no alive node")

    def key(n: dict[str, Any]) -> tuple[bool, tuple[int, ...], str]:
        ip = tuple(int(x) for x in str(n.get("NodeManagerAddress", "0")).split(".") if x.isdigit())
        return ("node:__internal_head__" not in n.get("Resources", {}), ip, n["NodeID"])

    return [n["NodeID"] for n in sorted(alive, key=key)]


def node_resource(ray: Any, nodes: list[str], resource: str) -> list[float]:
    """How much of ``resource`` (``GPU``, ``CPU``) Ray reports on each of ``nodes`` (ids), in
    that order."""
    have = {n["NodeID"]: float(n.get("Resources", {}).get(resource, 0.0)) for n in ray.nodes() if n.get("Alive")}
    return [have.get(n, 0.0) for n in nodes]


def on_node(node_id: str) -> Any:
    """A scheduling strategy that pins an actor to ``node_id`` (it fails if the node is gone)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
