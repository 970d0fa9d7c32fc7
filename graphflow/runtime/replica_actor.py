"""``ReplicaActor``: the Ray actor shell of a ``ReplicaWorker``.

The worker (model, block store, transport) is built inside the actor's process; this module
itself loads without torch. Ray's per-client server on the head imports the module of every
actor class a client looks up by name, to learn its methods: while the actor class was a
subclass of ``ReplicaWorker``, each connected client cost the head a process with torch and the
engine loaded (352 MiB instead of 157, and a ``graphflow submit`` 1.8 s slower in median, measured
here; see the README).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ray

from graphflow.runtime.actor_names import CLIENT_GROUP, MANAGER_NAME, NAMESPACE, STATUS_GROUP
from graphflow.runtime.owners import gone_jobs, watch_owners
from graphflow.runtime.periodic import every
from graphflow.runtime.replica_config import ReplicaConfig

__all__ = ["CLIENT_METHODS", "STATUS_METHODS", "WAITING_REPORT_S", "WORKER_METHODS", "ReplicaActor"]

WAITING_REPORT_S = 5.0  # how often a replica hands the manager the evictions no result has carried

# ReplicaWorker's public methods, each forwarded by the actor (a unit test keeps this list equal to
# the class's); those on the status group are never queued behind other runs' node calls
WORKER_METHODS = (
    "address",
    "clear_kv",
    "close",
    "cost_samples",
    "decode_seconds",
    "decode_text",
    "encode",
    "end_runs_of",
    "holdings",
    "info",
    "inject_fault",
    "kv_bytes_per_token",
    "materialize",
    "max_positions",
    "memory",
    "model_key",
    "plan",
    "prefill_seconds",
    "probe",
    "release",
    "report_waiting",
    "run_node",
    "run_owners",
    "send_blocks",
    "template_report",
)
# NOTE: cancel: the node it frees holds a thread; forget_peer: called while a failure is being handled
STATUS_METHODS = ("queue_length", "stats", "end_run", "cancel_receive", "forget_peer")
# a client's own calls (its attach, its task's tokens and plan, operation texts, decoded outputs) on the
# client group: a new client's first task never waits behind the node calls filling the default group
CLIENT_METHODS = ("decode_text", "encode", "kv_bytes_per_token", "max_positions", "model_key", "plan")


class ReplicaActor:
    """The Ray actor of a replica: a ``ReplicaWorker`` that knows its Ray node, stops
    protecting states for the runs of clients that are gone (``runtime.manager_actor`` ends
    those runs at the manager) and hands the manager, every :data:`WAITING_REPORT_S`, the
    evictions no result has carried yet (``runtime.deliveries``); its cheap calls (queue length,
    stats) run on the ``status`` concurrency group and a client's own calls (encode, plan, decode
    text) on the ``client`` group, never behind its nodes."""

    def __init__(self, config: ReplicaConfig) -> None:
        from graphflow.runtime.replica import ReplicaWorker  # NOTE: torch and the engine, in the actor only

        node = config.node or ray.get_runtime_context().get_node_id()
        self._worker = ReplicaWorker(replace(config, node=node, host=config.host or ray.util.get_node_ip_address()))
        self._stop = threading.Event()
        gcs = ray._private.worker.global_worker.gcs_client  # type: ignore[attr-defined]  # NOTE: set when connected
        watch_owners(self._worker, lambda jobs: gone_jobs(gcs, jobs), self._stop)
        every(WAITING_REPORT_S, lambda: self._worker.report_waiting(_apply_at_manager), self._stop, "report evictions")

    def close(self) -> None:
        self._stop.set()
        self._worker.close()


def _apply_at_manager(events: list[Any]) -> None:
    """Apply ``events`` at the deployment's manager (found by name: it may have been restarted)."""
    manager = ray.get_actor(MANAGER_NAME, namespace=NAMESPACE)
    ray.get(manager.apply.remote(events, time.time()))


def _forward(name: str) -> Callable[..., Any]:
    def method(self: ReplicaActor, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._worker, name)(*args, **kwargs)

    method.__name__ = name
    method.__qualname__ = f"ReplicaActor.{name}"
    return method


for _name in WORKER_METHODS:
    if _name not in vars(ReplicaActor):
        setattr(ReplicaActor, _name, _forward(_name))
for _name in STATUS_METHODS:
    setattr(ReplicaActor, _name, ray.method(concurrency_group=STATUS_GROUP)(_forward(_name)))
for _name in CLIENT_METHODS:
    setattr(ReplicaActor, _name, ray.method(concurrency_group=CLIENT_GROUP)(_forward(_name)))
