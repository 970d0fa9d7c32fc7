"""Thin Ray actor shells around plain classes, and the Ray deployment the executor drives.

* ``ReplicaWorker`` → named actor ``graphflow-replica-<i>`` (``ReplicaActor``, in
  ``runtime.replica_actor``: threaded, so a replica can send blocks while it runs a node);
* ``KVStateManager`` → named, detached actor ``graphflow-manager`` shared by every client
  (``ManagerActor``, in ``runtime.manager_actor``: it also ends the runs of clients that are gone);
* ``Board`` → named actor ``graphflow-board``: values the deployment shares with its clients
  (the calibration measured at ``graphflow serve``, so clients need not re-measure);
* ``CallWorker`` → a process that runs a named function (two-process checks on Ray).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from collections.abc import Sequence
from typing import Any

from graphflow.runtime.actor_names import BOARD_NAME, CLIENT_GROUP, MANAGER_NAME, NAMESPACE, STATUS_GROUP
from graphflow.runtime.deployment import TRANSPORTS, Deployment, gpu_shortfall, replica_threads
from graphflow.runtime.errors import load_or_why
from graphflow.runtime.manager_actor import ManagerActor
from graphflow.runtime.ray_nodes import node_resource, on_node, spread_nodes
from graphflow.runtime.replica_actor import ReplicaActor
from graphflow.runtime.replica_config import ReplicaConfig
from graphflow.runtime.stats import NodeInfo, ReplicaStats

__all__ = [
    "BOARD_NAME",
    "MANAGER_NAME",
    "TRANSPORTS",
    "Board",
    "CallWorker",
    "Deployment",
    "RayCluster",
    "ReplicaActor",
    "call_worker",
    "on_node",
    "replica_name",
]

SNAPSHOT_KEY = "snapshot_dir"
DEPLOYMENT_KEY = "deployment"
HEAD_KEY = "head"  # the Ray head `graphflow serve` started (runtime.cluster.head_record); absent: one it was given
# NOTE: a node's KV buffers (the rebuilt cache, each layer's grown keys and values) are tens to
# hundreds of MiB; glibc hands them back to the OS when freed, from the actor's thread arenas
# at once, and touching fresh pages costs ~1.2 ms per MiB in this VM (a 4K-token SmolLM2 node
# paid ~0.3 s for it). Replicas keep freed memory instead: one malloc arena, no trimming, and
# buffers up to glibc's largest mmap threshold (32 MiB) from the heap.
REPLICA_ENV = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_TRIM_THRESHOLD_": str(2**32 - 1),
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
}
# NOTE: Ray records every call on an actor (a task event) in the GCS until its cap of task events:
# a workflow makes several calls per node on the replicas and the manager, and the head's GCS
# grew 0.42 MiB per `graphflow submit` with them recorded, 0.21 without (20 submits, README).
# Nothing reads them on the head `serve` starts (no dashboard, so no state API);
# GRAPHFLOW_RAY_TASK_EVENTS=1 in the environment of `serve` records them, for a Ray cluster whose
# dashboard (`ray list tasks`) should show these actors' calls.
TASK_EVENTS = os.environ.get("GRAPHFLOW_RAY_TASK_EVENTS", "") == "1"


def named_actor(ray: Any, name: str, cls: type) -> Any:
    """``ray.get_actor(name)`` for an actor of class ``cls``. Through the Ray client, the handle
    is given ``cls``'s method signatures from this process's copy of the class: left without
    them, the client fetches them on its first call with a task that starts a worker and
    imports the class there (1.6–2.0 s per class measured here on every ``graphflow submit``).

    Raises:
        ValueError: no actor of that name (as ``ray.get_actor``).
    """
    handle = ray.get_actor(name, namespace=NAMESPACE)
    try:  # NOTE: the Ray client's own classes (not public API): where they differ, the slower handle
        from ray.util.client.common import ClientActorClass, ClientActorHandle

        if isinstance(handle, ClientActorHandle) and handle._method_num_returns is None:
            # NOTE: what the client does itself for an actor it created (ClientActorHandle's actor_class)
            return ClientActorHandle(handle.actor_ref, ClientActorClass(cls))
    except (ImportError, AttributeError, TypeError):
        pass
    return handle


def _head_actor(ray: Any, cls: type, name: str, *args: Any, **options: Any) -> Any:
    """The deployment's named actor ``name`` of ``cls`` (created with ``args`` where there is
    none; ``options``: lifetime, placement): no CPU of its own, no task events (see above)."""
    return (
        ray.remote(cls)
        .options(
            name=name,
            namespace=NAMESPACE,
            get_if_exists=True,
            num_cpus=0,
            enable_task_events=TASK_EVENTS,
            **options,
        )
        .remote(*args)
    )


def _board(ray: Any, **options: Any) -> Any:
    """The deployment's board, created where there is none (``options``: lifetime, placement)."""
    return _head_actor(ray, Board, BOARD_NAME, **options)


def _manager(ray: Any, **options: Any) -> Any:
    """The deployment's KV manager, created (empty) where there is none (``options`` as above)."""
    return _head_actor(ray, ManagerActor, MANAGER_NAME, 16, time.time(), **options)


def _live_replicas(ray: Any, manager: Any) -> tuple[dict[str, Any], list[str]]:
    """The manager's replicas whose actors still exist (handles), and those that are gone
    (their node died): the manager forgets the blocks of those."""
    handles, lost, gone = {}, [], []
    for info in ray.get(manager.list_replicas.remote()):
        try:
            handles[info.name] = named_actor(ray, info.name, ReplicaActor)
        except ValueError:
            ray.get(manager.drop_replica.remote(info.name))
            lost.append(info.name)
            gone.append(info.address)
    forget_peers(ray, list(handles.values()), gone)
    return handles, lost


FORGET_WAIT_S = 10.0  # how long the survivors of a replica that is gone get to drop their endpoint to it


def forget_peers(ray: Any, replicas: Sequence[Any], addresses: Sequence[str]) -> None:
    """Have each of ``replicas`` (actor handles) drop its endpoints to the transport ``addresses``
    of replicas that are gone (for a same-host UCX peer, the endpoint maps the dead process's
    shared memory; a replica restarted by ``serve`` has a new address). Waits at most
    :data:`FORGET_WAIT_S` for all of them together: a replica that does not answer by then (on a
    node that died too, not yet declared dead) is left to the caller's next call to find."""
    from ray.exceptions import RayActorError

    refs = [r.forget_peer.remote(a) for a in addresses if a for r in replicas]
    if not refs:
        return
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=FORGET_WAIT_S)
    for ref in ready:
        with contextlib.suppress(RayActorError):
            ray.get(ref)


def replica_name(i: int) -> str:
    return f"graphflow-replica-{i}"


def _replica_config(want: Deployment, name: str, timeout_s: float, eviction: str, threads: int) -> ReplicaConfig:
    """The replica ``name`` of deployment ``want``, on ``threads`` torch threads (0: every core)."""
    return ReplicaConfig(
        name,
        want.model,
        want.capacity_bytes,
        transport=want.transport,
        timeout_s=timeout_s,
        kv_mode=want.kv_mode,
        device=want.device,
        eviction=eviction,
        recompute_head=want.recompute_head,
        recompute_fraction=want.recompute_fraction,
        threads=threads,
        prefault_bytes=want.prefault_bytes,
        batching=want.batching,
        max_batch_tokens=want.max_batch_tokens,
        linear_kernel=want.linear_kernel,
    )


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
    """Replica actors + manager actor; satisfies ``runtime.cluster_api.Cluster``."""

    def __init__(self, ray: Any, replicas: list[str], handles: dict[str, Any], manager: Any, board: Any) -> None:
        self.ray = ray
        self.replicas = replicas
        self.handles = handles
        self._manager = manager
        self._board = board
        self.lost: list[str] = []  # replicas found dead (their blocks forgotten)
        self.owner = ray.get_runtime_context().get_job_id()  # this client's Ray job (NodePlan.owner)
        self.snapshot_note = ""  # why the last restarted manager did not load the snapshot ("" if it did)

    @classmethod
    def start(
        cls,
        ray: Any,
        want: Deployment,
        detached: bool = False,
        snapshot_dir: str = "",
        timeout_s: float = 120.0,
        replace_existing: bool = False,
        eviction: str = "score",
    ) -> RayCluster:
        """Create the manager and the replica actors of ``want``, unless it already runs.

        A running deployment that equals ``want`` is attached to; one of anything else is
        refused with ``ValueError`` naming both, or, with ``replace_existing``, shut down first.
        With ``snapshot_dir`` the manager snapshots its catalog there (Parquet), and a manager
        that dies is restarted from it plus what the replicas report holding. With
        ``want.spread``, replica ``i`` runs on the ``i mod N``-th alive node (the head first, then
        by address) and the manager and board on the head; otherwise Ray places them. Replicas
        give up on a transfer after ``timeout_s`` and evict by ``eviction``."""
        running, started_head = cls._running(ray), None
        if running is not None and running != want:
            if not replace_existing:
                raise ValueError(
                    f"this Ray cluster already serves {running.describe()}; asked for {want.describe()}: "
                    "stop it (`graphflow shutdown`) or pass --replace"
                )
            old = cls.attach(ray)
            started_head = old.shared(HEAD_KEY)  # NOTE: the Ray head outlives the deployment it is replaced under
            old.shutdown()
            time.sleep(1.0)  # NOTE: let Ray release the actors' names before they are created again
        life = {"lifetime": "detached"} if detached else {}
        alive = spread_nodes(ray)
        nodes = alive if want.spread else []
        short = gpu_shortfall(want, node_resource(ray, alive, "GPU"))
        if short:
            raise ValueError(short)
        threads = replica_threads(want, node_resource(ray, alive, "CPU"))
        head = {"scheduling_strategy": on_node(nodes[0])} if nodes else {}
        manager = _manager(ray, **life, **head)
        board = _board(ray, **life, **head)
        _live_replicas(ray, manager)  # a replica that died is started afresh below, with an empty store
        names = [replica_name(i) for i in range(want.replicas)]
        handles = {}
        for i, name in enumerate(names):
            place = {"scheduling_strategy": on_node(nodes[i % len(nodes)])} if nodes else {}
            cfg = _replica_config(want, name, timeout_s, eviction, threads[i])
            # NOTE: with the engine loop, the actor's threads only wait on it (its queue bounds them);
            # without it, each thread runs a forward of its own on the same cores
            actor = ray.remote(concurrency_groups={STATUS_GROUP: 2, CLIENT_GROUP: 2})(ReplicaActor).options(
                name=name,
                namespace=NAMESPACE,
                get_if_exists=True,
                num_cpus=0,
                num_gpus=want.gpus_per_replica,
                max_concurrency=cfg.max_queue if want.batching else 4,
                enable_task_events=TASK_EVENTS,
                runtime_env={"env_vars": REPLICA_ENV},
                **life,
                **place,
            )
            handles[name] = actor.remote(cfg)
        infos = ray.get([handles[n_].info.remote() for n_ in names])
        ray.get([manager.add_replica.remote(i) for i in infos])
        cluster = cls(ray, names, handles, manager, board)
        cluster.share(DEPLOYMENT_KEY, want)
        if started_head is not None:
            cluster.share(HEAD_KEY, started_head)
        if snapshot_dir:
            cluster.share(SNAPSHOT_KEY, snapshot_dir)
            ray.get(manager.enable_snapshots.remote(snapshot_dir))
            ray.get(manager.snapshot.remote(snapshot_dir))  # never leave an older deployment's snapshot there
        return cluster

    @staticmethod
    def _running(ray: Any) -> Deployment | None:
        """The deployment on this Ray cluster (``None``: none)."""
        try:
            board = named_actor(ray, BOARD_NAME, Board)
            named_actor(ray, MANAGER_NAME, ManagerActor)
        except ValueError:
            return None
        found = ray.get(board.get.remote(DEPLOYMENT_KEY))
        return found if isinstance(found, Deployment) else None

    @classmethod
    def attach(cls, ray: Any) -> RayCluster:
        """Find a running deployment (``graphflow serve``) by its actor names."""
        try:
            manager = named_actor(ray, MANAGER_NAME, ManagerActor)
        except ValueError:
            raise ValueError("no GraphFlow deployment on this Ray cluster; start one with `graphflow serve`") from None
        handles, lost = _live_replicas(ray, manager)
        try:
            board = named_actor(ray, BOARD_NAME, Board)  # NOTE: 3.9 s faster through the client than get_if_exists
        except ValueError:  # a deployment whose board is gone: a new, empty one (nothing measured to share)
            board = _board(ray, lifetime="detached")
        cluster = cls(ray, list(handles), handles, manager, board)
        cluster.lost = lost
        return cluster

    def call(self, replica: str, method: str, *args: Any) -> Any:
        return getattr(self.handles[replica], method).remote(*args)

    def queue_lengths(self) -> dict[str, int]:
        """Node calls in each live replica now (a replica that does not answer is left out)."""
        from ray.exceptions import RayActorError

        got = {}
        for r, ref in [(r, self.call(r, "queue_length")) for r in list(self.replicas)]:
            with contextlib.suppress(RayActorError):
                got[r] = int(self.ray.get(ref))
        return got

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
        self._manager = _manager(ray, lifetime="detached")
        snapshot_dir = self.shared(SNAPSHOT_KEY)
        if snapshot_dir:
            manager = self._manager
            self.snapshot_note = load_or_why(lambda: ray.get(manager.load_snapshot.remote(snapshot_dir)), snapshot_dir)
        reported = 0
        for name in list(self.replicas):
            try:
                info, held = ray.get([self.handles[name].info.remote(), self.handles[name].holdings.remote()])
            except RayActorError:
                self.replicas = [r for r in self.replicas if r != name]
                self.handles.pop(name, None)
                continue
            reported += ray.get(self._manager.resync_replica.remote(info, held, time.time()))
            report = ray.get(self.handles[name].template_report.remote())
            if report.holdings:  # what it can rebuild: not in the snapshot, re-reported like its holdings
                ray.get(self._manager.apply.remote([report], time.time()))
        if snapshot_dir:
            ray.get(self._manager.enable_snapshots.remote(snapshot_dir))
        return reported

    def kill_manager(self) -> None:
        """Kill the manager actor (fault injection: ``graphflow check faults``)."""
        self.ray.kill(self._manager, no_restart=True)

    def wait_one(self, handles: Sequence[Any], timeout_s: float | None = None) -> Any | None:
        """The first of ``handles`` to finish; ``None`` when none has within ``timeout_s``."""
        done, _ = self.ray.wait(list(handles), num_returns=1, timeout=timeout_s)
        return done[0] if done else None

    def get(self, handle: Any) -> Any:
        return self.ray.get(handle)

    def is_replica_failure(self, exc: BaseException) -> bool:
        from ray.exceptions import RayActorError

        return isinstance(exc, RayActorError)

    def drop_replica(self, replica: str) -> None:
        """Stop using a replica that died; the manager forgets the blocks it held."""
        address = next((i.address for i in self.manager("list_replicas") if i.name == replica), "")
        self.replicas = [r for r in self.replicas if r != replica]
        self.handles.pop(replica, None)
        self.manager("drop_replica", replica)
        forget_peers(self.ray, [self.handles[r] for r in self.replicas], [address])

    def shared(self, key: str) -> Any:
        """A value the deployment shares with clients (``None`` if never set)."""
        return self.ray.get(self._board.get.remote(key))

    def share(self, key: str, value: Any) -> None:
        self.ray.get(self._board.put.remote(key, value))

    def stats(self) -> list[ReplicaStats]:
        """Replica memory, blocks, transport and node, with the manager's prefix-hit counts."""
        from ray.exceptions import RayActorError

        stats = []
        for r in list(self.replicas):
            try:
                stats.append(self.ray.get(self.call(r, "stats")))
            except RayActorError:  # died (with its node, maybe): stop using it
                self.drop_replica(r)
                self.lost.append(r)
        hits = self.manager("hit_stats")
        names = {info.address: info.name for info in self.manager("list_replicas") if info.address}
        return [(s.with_hits(hits[s.replica]) if s.replica in hits else s).with_peer_names(names) for s in stats]

    def nodes(self) -> list[NodeInfo]:
        """The Ray cluster's nodes: id, address, alive, and which replicas it runs."""
        on: dict[str, list[str]] = {}
        for info in self.manager("list_replicas"):
            on.setdefault(info.node, []).append(info.name)
        return [
            NodeInfo(n["NodeID"], n.get("NodeManagerAddress", ""), bool(n.get("Alive")), tuple(on.get(n["NodeID"], ())))
            for n in self.ray.nodes()
        ]

    def deployment(self) -> Deployment | None:
        found = self.shared(DEPLOYMENT_KEY)
        return found if isinstance(found, Deployment) else None

    def shutdown(self) -> None:
        for h in [*self.handles.values(), self._manager, self._board]:
            self.ray.kill(h)
