"""What the executor needs from a deployment: the same plain executor runs over Ray actors
(``runtime.actors.RayCluster``) and over in-process workers (``runtime.local``, unit tests)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["Cluster"]


class Cluster(Protocol):
    """What the executor needs from a deployment (Ray actors or in-process workers)."""

    replicas: list[str]
    # who runs the workflows (a Ray job id): replicas end the runs of an owner that is gone, so a
    # killed client does not protect its states from eviction forever ('' = never gone)
    owner: str

    def call(self, replica: str, method: str, *args: Any) -> Any: ...  # returns a handle
    def manager(self, method: str, *args: Any) -> Any: ...  # returns the value
    def wait_one(self, handles: Sequence[Any], timeout_s: float | None = None) -> Any | None: ...  # None: timed out
    def get(self, handle: Any) -> Any: ...
    def queue_lengths(self) -> dict[str, int]: ...  # node calls in each replica now (all clients)
    def is_replica_failure(self, exc: BaseException) -> bool: ...  # the replica itself is gone
    def drop_replica(self, replica: str) -> None: ...  # stop using it; the manager forgets its blocks
