"""How the executor survives lost replicas and failed transfers.

A plain class over the executor's :class:`~graphflow.runtime.cluster_api.Cluster`: a replica that
is gone is dropped (the manager forgets its blocks) and the run goes on with the others; a
node whose replica died or whose transfer failed is recomputed, and why is said in its trace;
anything else (a bad request, a bug) reaches the caller. When every replica is gone,
:class:`~graphflow.runtime.errors.Unavailable`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphflow.kv.errors import MissingBlocks
from graphflow.runtime.cluster_api import Cluster
from graphflow.runtime.errors import Unavailable, root_cause
from scheduler.policy import Decision
from transport.errors import TransportError

__all__ = ["Failures"]

ALL_LOST = "every replica failed; restart the deployment (`graphflow serve`)"


class Failures:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def failed(self, exc: BaseException, d: Decision, handles: Sequence[Any], tries: int) -> str:
        """A node attempt failed: decide whether to retry it (by recompute) and say why."""
        c = self.cluster
        if c.is_replica_failure(exc):
            self.lose(d.replica)
            why = f"replica {d.replica} lost"
        elif isinstance(exc, TransportError | MissingBlocks):
            why = f"transfer from {d.source} failed ({type(root_cause(exc)).__name__})"
        else:
            raise exc  # a bad request or a bug: the caller gets the error
        self.finish_sends(d, handles[1:])
        if tries > len(c.replicas) + 1:
            raise Unavailable(f"node failed {tries} times, last because {why}") from exc
        return f"{why}; recomputed"

    def sent(self, send: Any, receiver: str, transfer_id: int) -> None:
        """A send finished before its node: when it failed, the receiver is told at once, so
        the node fails now (and is recomputed) instead of at the transfer deadline. The send's
        own error is handled with the node's (:meth:`finish_sends`)."""
        try:
            self.cluster.get(send)
        except Exception as exc:
            if receiver in self.cluster.replicas:  # NOTE: not awaited; a lost receiver fails its node anyway
                why = f"the sender failed ({type(root_cause(exc)).__name__})"
                self.cluster.call(receiver, "cancel_receive", transfer_id, why)

    def finish_sends(self, d: Decision, sends: Sequence[Any]) -> None:
        """Collect the source replica's send; a source that died meanwhile is dropped."""
        for h in sends:
            try:
                self.cluster.get(h)
            except Exception as exc:
                if self.cluster.is_replica_failure(exc):
                    self.lose(d.source)
                elif not isinstance(exc, TransportError | MissingBlocks):
                    raise

    def alive(self, replica: str) -> bool:
        try:
            self.cluster.get(self.cluster.call(replica, "address"))
            return True
        except Exception as exc:
            if self.cluster.is_replica_failure(exc):
                return False
            raise

    def lose(self, replica: str) -> None:
        """Stop using ``replica``; :class:`Unavailable` once none is left."""
        if replica in self.cluster.replicas:
            self.cluster.drop_replica(replica)
        if not self.cluster.replicas:
            raise Unavailable(ALL_LOST)

    def tell_all(self, method: str, *args: Any) -> None:
        """Call ``method`` on every live replica and wait; a lost one is dropped."""
        handles = {r: self.cluster.call(r, method, *args) for r in list(self.cluster.replicas)}
        for r, h in handles.items():
            try:
                self.cluster.get(h)
            except Exception as exc:
                if not self.cluster.is_replica_failure(exc):
                    raise
                self.lose(r)
