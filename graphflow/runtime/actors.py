"""Thin Ray actor shells around plain classes, and the Ray deployment the executor drives.

* ``ReplicaWorker`` → named actor ``graphflow-replica-<i>`` (threaded: a replica can send
  blocks while it runs a node);
* ``KVStateManager`` → named, detached actor ``graphflow-manager`` shared by every client;
* ``Board`` → named actor ``graphflow-board``: values the deployment shares with its clients
  (the calibration measured at ``graphflow serve``, so clients need not re-measure);
* ``CallWorker`` → a process that runs a named function (two-process checks on Ray).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Sequence
from typing import Any

from graphflow.kv.manager import KVStateManager, ReplicaInfo
from graphflow.runtime.replica import ReplicaConfig, ReplicaWorker
from graphflow.runtime.templates import kv_mode as kv_mode_of

__all__ = ["BOARD_NAME", "MANAGER_NAME", "Board", "CallWorker", "RayCluster", "call_worker", "replica_name"]

MANAGER_NAME = "graphflow-manager"
BOARD_NAME = "graphflow-board"
SNAPSHOT_KEY = "snapshot_dir"
NAMESPACE = "graphflow"


def replica_name(i: int) -> str:
    return f"graphflow-replica-{i}"


class Board:
    """Named values shared by a deployment and its clients."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}

    def put(self, key: str, value: Any) -> None:
        self._values[key] = value

    def get(self, key: str) -> Any:
        return self._values.get(key)


class CallWorker:
    """A process that runs a named plain function; used for two-process checks on Ray."""

    def call(self, target: str, *args: Any, **kwargs: Any) -> Any:
        module, name = target.split(":")
        return getattr(importlib.import_module(module), name)(*args, **kwargs)


def call_worker(ray: Any, **options: Any) -> Any:
    """A new ``CallWorker`` actor (``options`` go to ``.options()``, e.g. ``num_cpus``)."""
    return ray.remote(CallWorker).options(**options).remote()


class RayCluster:
    """Replica actors + manager actor; satisfies ``runtime.executor.Cluster``."""

    def __init__(self, ray: Any, replicas: list[str], handles: dict[str, Any], manager: Any, board: Any) -> None:
        self.ray = ray
        self.replicas = replicas
        self.handles = handles
        self._manager = manager
        self._board = board

    @classmethod
    def start(cls, ray: Any, model: str, n: int, capacity_bytes: int = 1 << 30, detached: bool = False,
              snapshot_dir: str = "", timeout_s: float = 120.0, kv_mode: str = "exact") -> RayCluster:  # fmt: skip
        """Create the manager and ``n`` replica actors (reusing any that already exist).

        With ``snapshot_dir`` the manager snapshots its catalog there (Parquet), and a manager
        that dies is restarted from it plus what the replicas report holding. ``kv_mode``:
        ``exact``, ``differential`` or ``stateless`` template KV (``graphflow.runtime.templates``)."""
        if n <= 0:
            raise ValueError(f"need at least one replica, got {n}")
        kv_mode_of(kv_mode)  # a clear error here rather than from inside every actor
        life = {"lifetime": "detached"} if detached else {}
        manager = ray.remote(KVStateManager).options(name=MANAGER_NAME, namespace=NAMESPACE, get_if_exists=True,
                                                     num_cpus=0, **life).remote()  # fmt: skip
        board = ray.remote(Board).options(name=BOARD_NAME, namespace=NAMESPACE, get_if_exists=True, num_cpus=0,
                                          **life).remote()  # fmt: skip
        names = [replica_name(i) for i in range(n)]
        handles = {}
        for name in names:
            cfg = ReplicaConfig(name, model, capacity_bytes, transport="ray", timeout_s=timeout_s, kv_mode=kv_mode)
            actor = ray.remote(ReplicaWorker).options(
                name=name, namespace=NAMESPACE, get_if_exists=True, num_cpus=0, max_concurrency=4, **life
            )
            handles[name] = actor.remote(cfg)
        addresses = ray.get([handles[n_].address.remote() for n_ in names])
        ray.get([manager.add_replica.remote(ReplicaInfo(n_, budget_bytes=capacity_bytes, address=a))
                 for n_, a in zip(names, addresses, strict=True)])  # fmt: skip
        cluster = cls(ray, names, handles, manager, board)
        if snapshot_dir:
            cluster.share(SNAPSHOT_KEY, snapshot_dir)
            ray.get(manager.enable_snapshots.remote(snapshot_dir))
            ray.get(manager.snapshot.remote(snapshot_dir))  # never leave an older deployment's snapshot there
        return cluster

    @classmethod
    def attach(cls, ray: Any) -> RayCluster:
        """Find a running deployment (``graphflow serve``) by its actor names."""
        try:
            manager = ray.get_actor(MANAGER_NAME, namespace=NAMESPACE)
        except ValueError:
            raise ValueError("no GraphFlow deployment on this Ray cluster; start one with `graphflow serve`") from None
        infos = ray.get(manager.list_replicas.remote())
        names = [i.name for i in infos]
        handles = {n: ray.get_actor(n, namespace=NAMESPACE) for n in names}
        board = ray.remote(Board).options(name=BOARD_NAME, namespace=NAMESPACE, get_if_exists=True, num_cpus=0,
                                          lifetime="detached").remote()  # fmt: skip
        return cls(ray, names, handles, manager, board)

    def call(self, replica: str, method: str, *args: Any) -> Any:
        return getattr(self.handles[replica], method).remote(*args)

    def manager(self, method: str, *args: Any) -> Any:
        """Call the manager; a manager that died is restarted (see :meth:`restart_manager`)."""
        from ray.exceptions import RayActorError

        try:
            return self.ray.get(getattr(self._manager, method).remote(*args))
        except RayActorError:
            self.restart_manager()
            if method == "apply":
                return None  # NOTE: the replicas' holdings, resynced on restart, already include these events
            return self.ray.get(getattr(self._manager, method).remote(*args))

    def restart_manager(self) -> int:
        """Start a new manager actor, restore the last snapshot (if the deployment keeps one) and
        resync every live replica's holdings; returns the states the replicas reported."""
        from ray.exceptions import RayActorError

        ray = self.ray
        opts = {"name": MANAGER_NAME, "namespace": NAMESPACE, "get_if_exists": True, "lifetime": "detached"}
        self._manager = ray.remote(KVStateManager).options(num_cpus=0, **opts).remote()
        snapshot_dir = self.shared(SNAPSHOT_KEY)
        if snapshot_dir:
            with contextlib.suppress(ValueError):  # no snapshot yet: the replicas' holdings alone rebuild it
                ray.get(self._manager.load_snapshot.remote(snapshot_dir))
        reported = 0
        for name in list(self.replicas):
            try:
                info, held = ray.get([self.handles[name].info.remote(), self.handles[name].holdings.remote()])
            except RayActorError:
                self.replicas = [r for r in self.replicas if r != name]
                self.handles.pop(name, None)
                continue
            reported += ray.get(self._manager.resync_replica.remote(info, held))
        if snapshot_dir:
            ray.get(self._manager.enable_snapshots.remote(snapshot_dir))
        return reported

    def kill_manager(self) -> None:
        """Kill the manager actor (fault injection: ``graphflow check faults``)."""
        self.ray.kill(self._manager, no_restart=True)

    def wait_one(self, handles: Sequence[Any]) -> Any:
        done, _ = self.ray.wait(list(handles), num_returns=1)
        return done[0]

    def get(self, handle: Any) -> Any:
        return self.ray.get(handle)

    def is_replica_failure(self, exc: BaseException) -> bool:
        from ray.exceptions import RayActorError

        return isinstance(exc, RayActorError)

    def drop_replica(self, replica: str) -> None:
        """Stop using a replica that died; the manager forgets the blocks it held."""
        self.replicas = [r for r in self.replicas if r != replica]
        self.handles.pop(replica, None)
        self.manager("drop_replica", replica)

    def shared(self, key: str) -> Any:
        """A value the deployment shares with clients (``None`` if never set)."""
        return self.ray.get(self._board.get.remote(key))

    def share(self, key: str, value: Any) -> None:
        self.ray.get(self._board.put.remote(key, value))

    def stats(self) -> list[dict[str, Any]]:
        """Replica memory and blocks, with the manager's prefix-hit counts per replica."""
        hits = self.manager("hit_stats")
        stats = self.ray.get([self.handles[r].stats.remote() for r in self.replicas])
        return [{**s, **hits.get(s["replica"], {})} for s in stats]

    def shutdown(self) -> None:
        for h in [*self.handles.values(), self._manager, self._board]:
            self.ray.kill(h)
