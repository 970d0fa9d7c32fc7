"""Peak resident-memory growth of a deployment's replicas over a measured window.

:meth:`ReplicaMemory.start` asks each replica to hand freed memory back to the OS and restart
its peak (``VmHWM``), and records its resident bytes then; :meth:`ReplicaMemory.growth` is each
replica's peak since, minus that start, summed. A replica with a prefaulted KV pool
(``--prefault-mib``) receives into the pool, and what lands there is not growth; the
benchmarks' embedded replicas have none, so there growth is all the memory a window needed
(KV computed, received or kept, caches being built and batched, activations). Handing freed
memory back includes the receive buffers a replica recycles, so the window's receives land in
fresh pages: slower than in steady state. ``graphflow bench serve`` and ``bench multi-agent``
measure with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from graphflow.client import Client

__all__ = ["ReplicaMemory"]


class ReplicaMemory:
    def __init__(self, client: Client) -> None:
        self.client = client
        self._start: dict[str, int] = {}

    def start(self, replicas: Sequence[str] = ()) -> None:
        """Restart the peak of ``replicas`` (default every replica) and record their resident bytes."""
        c = self.client.cluster
        names = list(replicas or c.replicas)
        got = [c.get(c.call(r, "memory", True)) for r in names]
        self._start = {r: int(g[0]) for r, g in zip(names, got, strict=True)}

    def peak(self, replica: str) -> int:
        """``replica``'s peak resident bytes since the last :meth:`start`."""
        c = self.client.cluster
        return int(c.get(c.call(replica, "memory"))[1])

    def growth(self) -> int:
        """Peak minus start, summed over the replicas :meth:`start` measured."""
        if not self._start:
            raise RuntimeError("ReplicaMemory.growth before start")
        return sum(max(0, self.peak(r) - s) for r, s in self._start.items())

    def kept_bytes(self) -> int:
        """KV bytes the replicas' stores hold now (their pools' used bytes)."""
        return sum(s.used_bytes for s in self.client.status())
