"""``named_actor``: a Ray client handle gets its class's method signatures from this process
(no Ray started: the handle wraps a stand-in reference, and nothing is called on it)."""

from __future__ import annotations

from typing import Any

from ray.util.client.common import ClientActorHandle, ClientRemoteMethod

from graphflow.kv.manager import KVStateManager
from graphflow.runtime.actors import NAMESPACE, Board, ReplicaActor, named_actor


class _Ray:
    """What ``named_actor`` uses of the ``ray`` module: ``get_actor``."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.asked: list[tuple[str, str]] = []

    def get_actor(self, name: str, namespace: str) -> Any:
        self.asked.append((name, namespace))
        return self.handle


def test_client_handle_gets_the_class_signatures_here() -> None:
    ref = object()
    ray = _Ray(ClientActorHandle(ref))  # as the client's get_actor returns it: no class info
    handle = named_actor(ray, "graphflow-replica-0", ReplicaActor)
    assert ray.asked == [("graphflow-replica-0", NAMESPACE)]
    assert handle.actor_ref is ref
    assert handle._method_num_returns is not None  # NOTE: None would make the first call fetch it with a task
    method = handle.run_node
    assert isinstance(method, ClientRemoteMethod)
    assert list(method._signature.parameters) == list(handle._method_signatures["run_node"].parameters)
    assert "queue_length" in handle._method_signatures and "__init__" in handle._method_signatures


def test_each_class_gets_its_own_methods() -> None:
    manager = named_actor(_Ray(ClientActorHandle(object())), "graphflow-manager", KVStateManager)
    board = named_actor(_Ray(ClientActorHandle(object())), "graphflow-board", Board)
    assert "list_replicas" in manager._method_signatures and "run_node" not in manager._method_signatures
    assert set(board._method_signatures) >= {"get", "put"}


def test_other_handles_are_returned_as_they_are() -> None:
    plain = object()  # a driver's own ActorHandle: Ray knows its class already
    assert named_actor(_Ray(plain), "graphflow-board", Board) is plain
    typed = ClientActorHandle(object(), None)
    typed._method_num_returns = {}  # a client handle that already has its class info
    assert named_actor(_Ray(typed), "graphflow-board", Board) is typed
