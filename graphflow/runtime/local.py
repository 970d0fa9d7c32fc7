"""In-process deployment: replicas as plain workers on a thread pool (tests, no Ray)."""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Sequence
from typing import Any

from graphflow.kv.manager import KVStateManager, ReplicaInfo
from graphflow.runtime.replica import ReplicaConfig, ReplicaWorker

__all__ = ["LocalCluster"]


class LocalCluster:
    """Same interface as the Ray deployment; replicas talk over the local transport."""

    def __init__(self, model: str, replicas: int = 2, capacity_bytes: int = 1 << 28) -> None:
        if replicas <= 0:
            raise ValueError(f"need at least one replica, got {replicas}")
        self.replicas = [f"replica-{i}" for i in range(replicas)]
        self.workers = {
            r: ReplicaWorker(ReplicaConfig(r, model, capacity_bytes, transport="local")) for r in self.replicas
        }
        self._manager = KVStateManager()
        for r in self.replicas:
            self._manager.add_replica(ReplicaInfo(r, budget_bytes=capacity_bytes, address=self.workers[r].address()))
        self._pool = cf.ThreadPoolExecutor(max_workers=4 * replicas)

    def call(self, replica: str, method: str, *args: Any) -> cf.Future[Any]:
        return self._pool.submit(getattr(self.workers[replica], method), *args)

    def manager(self, method: str, *args: Any) -> Any:
        return getattr(self._manager, method)(*args)

    def wait_one(self, handles: Sequence[cf.Future[Any]]) -> cf.Future[Any]:
        done, _ = cf.wait(handles, return_when=cf.FIRST_COMPLETED)
        return next(h for h in handles if h in done)

    def get(self, handle: cf.Future[Any]) -> Any:
        return handle.result()

    def stats(self) -> list[dict[str, Any]]:
        hits = self._manager.hit_stats()
        return [{**w.stats(), **hits.get(r, {})} for r, w in self.workers.items()]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for w in self.workers.values():
            w.transport.close()
