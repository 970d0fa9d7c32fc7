"""The executor's nodes in flight, across its runs: the load placement prices on each replica.

Placement charges a replica the prefill its nodes in flight were decided to take (the queue
term) and prices a node's decode by the rows that replica steps and the KV tokens each step
reads (:mod:`scheduler.decode`), where rows that continue one stored prefix read it once. The
replicas report how many requests they hold (``Cluster.queue_lengths``), not what those will
prefill or read, and a node just launched may not have reached its replica yet; so the executor
records every node it launches, with its predicted prefill and the prefix it continues, until
its result is back. One executor serves every thread of a client (workflows submitted at once),
so the record is shared by its runs and locked; a replica's requests beyond it (another
client's) are charged a prefill of the node's whole context and a context of their own each.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from scheduler.decode import Batch

__all__ = ["InFlight", "prefix_key"]


def prefix_key(tokens: Sequence[int], n: int) -> tuple[Hashable, int] | None:
    """A key for the stored prefix of ``tokens[:n]`` with its length (``None`` for no prefix):
    nodes of one model continuing equal leading tokens continue the same stored blocks."""
    return ((n, hash(tuple(tokens[:n]))), n) if n > 0 else None


@dataclass(frozen=True)
class _Node:
    replica: str
    prefix: tuple[Hashable, int] | None
    context: int
    prefill_s: float


class InFlight:
    def __init__(self) -> None:
        self._nodes: dict[tuple[str, str], _Node] = {}
        self._lock = threading.Lock()

    def add(
        self, run_id: str, node: str, replica: str, prefix: tuple[Hashable, int] | None, context: int, prefill_s: float
    ) -> None:
        """Node ``node`` of ``run_id`` now runs on ``replica`` over ``context`` tokens,
        continuing ``prefix`` (:func:`prefix_key`) from stored blocks and prefilling for
        ``prefill_s`` predicted seconds."""
        with self._lock:
            self._nodes[(run_id, node)] = _Node(replica, prefix, context, prefill_s)

    def remove(self, run_id: str, node: str) -> None:
        """Its result is back (or it failed): it loads its replica no more."""
        with self._lock:
            self._nodes.pop((run_id, node), None)

    def end_run(self, run_id: str) -> None:
        """The run is over, however it ended: none of its nodes counts any more."""
        with self._lock:
            for key in [k for k in self._nodes if k[0] == run_id]:
                del self._nodes[key]

    def _by_replica(self, replicas: Sequence[str]) -> dict[str, list[_Node]]:
        with self._lock:
            nodes = list(self._nodes.values())
        return {r: [n for n in nodes if n.replica == r] for r in replicas}

    def queue_s(self, replicas: Sequence[str], reported: Mapping[str, int], full_prefill_s: float) -> dict[str, float]:
        """Per replica, the prefill seconds ahead of a new node: what the nodes recorded there
        were decided to take, and ``full_prefill_s`` for each request it reports beyond them."""
        return {
            r: sum(n.prefill_s for n in here) + max(0, reported.get(r, 0) - len(here)) * full_prefill_s
            for r, here in self._by_replica(replicas).items()
        }

    def batches(self, replicas: Sequence[str], reported: Mapping[str, int], context: int) -> dict[str, Batch]:
        """Per replica, what its steps read: the nodes recorded there, each shared prefix once
        and each node's own tokens, and each request it reports beyond them reading ``context``
        tokens of its own."""
        out = {}
        for r, here in self._by_replica(replicas).items():
            prefixes = {n.prefix[0]: n.prefix[1] for n in here if n.prefix is not None}
            tokens = sum(prefixes.values()) + sum(n.context - (n.prefix[1] if n.prefix else 0) for n in here)
            unknown = max(0, reported.get(r, 0) - len(here))
            out[r] = Batch(len(here) + unknown, tokens + unknown * context, frozenset(prefixes))
        return out
