"""The replica's actor shell forwards every public method of ``ReplicaWorker`` (no Ray started:
the class is only inspected)."""

from __future__ import annotations

import inspect

from graphflow.runtime.actor_names import CLIENT_GROUP, STATUS_GROUP
from graphflow.runtime.replica import ReplicaWorker
from graphflow.runtime.replica_actor import CLIENT_METHODS, STATUS_METHODS, WORKER_METHODS, ReplicaActor


def _public(cls: type) -> set[str]:
    return {n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}


def test_every_worker_method_is_an_actor_method() -> None:
    assert set(WORKER_METHODS).isdisjoint(STATUS_METHODS)
    assert set(WORKER_METHODS) | set(STATUS_METHODS) == _public(ReplicaWorker)
    assert _public(ReplicaActor) == _public(ReplicaWorker)


def test_cheap_calls_run_on_the_status_group() -> None:
    groups = {n: getattr(getattr(ReplicaActor, n), "__ray_concurrency_group__", None) for n in _public(ReplicaActor)}
    assert {n for n, g in groups.items() if g == STATUS_GROUP} == set(STATUS_METHODS)
    assert {"queue_length", "stats", "end_run"} <= set(STATUS_METHODS)


def test_a_clients_own_calls_run_on_the_client_group_and_node_work_does_not() -> None:
    groups = {n: getattr(getattr(ReplicaActor, n), "__ray_concurrency_group__", None) for n in _public(ReplicaActor)}
    assert {n for n, g in groups.items() if g == CLIENT_GROUP} == set(CLIENT_METHODS)
    assert set(CLIENT_METHODS) <= set(WORKER_METHODS)
    assert {"encode", "plan", "decode_text"} <= set(CLIENT_METHODS)
    assert groups["run_node"] is None and groups["send_blocks"] is None  # the default group, bounded by the queue


class _Worker:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str):
        return lambda *a, **k: self.calls.append((name, a, k)) or name


def test_a_forwarded_call_reaches_the_worker_with_its_arguments() -> None:
    actor = ReplicaActor.__new__(ReplicaActor)  # NOTE: no __init__: that builds a real worker under Ray
    actor._worker = _Worker()  # type: ignore[assignment]
    assert actor.send_blocks([1, 2], 0, "peer", transfer_id=7) == "send_blocks"  # type: ignore[attr-defined]
    assert actor.stats() == "stats"  # type: ignore[attr-defined]
    assert actor._worker.calls == [("send_blocks", ([1, 2], 0, "peer"), {"transfer_id": 7}), ("stats", (), {})]
