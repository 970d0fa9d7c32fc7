"""In-process deployment: replicas as plain workers on a thread pool (tests, no Ray)."""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Sequence
from typing import Any

from graphflow.kv.manager import KVStateManager
from graphflow.runtime.errors import load_or_why
from graphflow.runtime.replica import ReplicaWorker
from graphflow.runtime.replica_config import ReplicaConfig
from graphflow.runtime.stats import ReplicaStats

__all__ = ["LocalCluster", "ReplicaUnavailable"]


class ReplicaUnavailable(RuntimeError):
    """A call went to a replica that was stopped."""


class LocalCluster:
    """Same interface as the Ray deployment; replicas talk over the local transport."""

    def __init__(
        self,
        model: str,
        replicas: int = 2,
        capacity_bytes: int = 1 << 28,
        timeout_s: float = 120.0,
        snapshot_dir: str = "",
        kv_mode: str = "exact",
        eviction: str = "score",
        **replica_options: Any,
    ) -> None:
        if replicas <= 0:
            raise ValueError(f"need at least one replica, got {replicas}")
        self.replicas = [f"replica-{i}" for i in range(replicas)]
        self.owner = ""  # in-process workers outlive no client: runs end only through end_run
        self.workers = {
            r: ReplicaWorker(
                ReplicaConfig(
                    r,
                    model,
                    capacity_bytes,
                    transport="local",
                    timeout_s=timeout_s,
                    kv_mode=kv_mode,
                    eviction=eviction,
                    **replica_options,
                )
            )
            for r in self.replicas
        }
        self._manager = KVStateManager(epoch_s=time.time())
        for r in self.replicas:
            self._manager.add_replica(self.workers[r].info())
        self.snapshot_dir = snapshot_dir
        if snapshot_dir:
            self._manager.enable_snapshots(snapshot_dir)
            self._manager.snapshot(snapshot_dir)
        self._pool = cf.ThreadPoolExecutor(max_workers=4 * replicas)
        self._stopped: set[str] = set()
        self.snapshot_note = ""  # why the last restarted manager did not load the snapshot ("" if it did)

    def call(self, replica: str, method: str, *args: Any) -> cf.Future[Any]:
        if replica in self._stopped:
            failed: cf.Future[Any] = cf.Future()
            failed.set_exception(ReplicaUnavailable(f"replica {replica} was stopped"))
            return failed
        return self._pool.submit(getattr(self.workers[replica], method), *args)

    def stop_replica(self, replica: str) -> None:
        """Stop a replica as if its process died: its transport closes, later calls fail."""
        self.workers[replica].transport.close()
        self._stopped.add(replica)

    def is_replica_failure(self, exc: BaseException) -> bool:
        return isinstance(exc, ReplicaUnavailable)

    def drop_replica(self, replica: str) -> None:
        self.replicas = [r for r in self.replicas if r != replica]
        self._manager.drop_replica(replica)

    def manager(self, method: str, *args: Any) -> Any:
        return getattr(self._manager, method)(*args)

    def restart_manager(self) -> int:
        """Replace the manager as if its process died: a fresh one restores the last snapshot
        (if kept) and resyncs every replica's holdings; returns the states reported."""
        manager = KVStateManager(epoch_s=time.time())
        if self.snapshot_dir:
            self.snapshot_note = load_or_why(lambda: manager.load_snapshot(self.snapshot_dir), self.snapshot_dir)
        live = [r for r in self.replicas if r not in self._stopped]
        reported = sum(
            manager.resync_replica(self.workers[r].info(), self.workers[r].holdings(), time.time()) for r in live
        )
        manager.apply([self.workers[r].template_report() for r in live], time.time())
        if self.snapshot_dir:
            manager.enable_snapshots(self.snapshot_dir)
        self._manager = manager
        return reported

    def wait_one(self, handles: Sequence[cf.Future[Any]], timeout_s: float | None = None) -> cf.Future[Any] | None:
        """The first of ``handles`` to finish; ``None`` when none has within ``timeout_s``."""
        done, _ = cf.wait(handles, timeout=timeout_s, return_when=cf.FIRST_COMPLETED)
        return next((h for h in handles if h in done), None)

    def get(self, handle: cf.Future[Any]) -> Any:
        return handle.result()

    def queue_lengths(self) -> dict[str, int]:
        return {r: self.workers[r].queue_length() for r in self.replicas if r not in self._stopped}

    def stats(self) -> list[ReplicaStats]:
        hits = self._manager.hit_stats()
        return [w.stats().with_hits(hits[r]) if r in hits else w.stats() for r, w in self.workers.items()]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for r, w in self.workers.items():
            w.close()
            if r not in self._stopped:
                w.transport.close()
