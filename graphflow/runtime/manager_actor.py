"""``ManagerActor``: the Ray actor of the KV-state manager (``KVStateManager``), which also ends
the runs of clients that went away without ending them.

A run's executor tells the manager when the run begins (with its client's Ray job id) and when it
ends. A client killed mid-run never says the second: every :data:`~graphflow.runtime.owners.OWNER_CHECK_S`
the actor asks Ray's job table which of its runs' clients have ended, and ends their runs, so
their records are forgotten in time like any other run's (the replicas do the same for the states
they protect). Every :data:`FORGET_CHECK_S` it also forgets the records of runs ended longer ago
than its retention, which otherwise only the next run's end would do. Both call the actor itself,
so the manager's state is touched only by its own calls, one at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import ray

from graphflow.kv.manager import KVStateManager
from graphflow.runtime.owners import gone_jobs, watch_owners
from graphflow.runtime.periodic import every

__all__ = ["FORGET_CHECK_S", "ManagerActor"]

FORGET_CHECK_S = 60.0


class _CallsOnItself:
    """The housekeeping's calls, made as calls on the manager actor (queued with its other calls)."""

    def __init__(self) -> None:
        self._me: Any = None

    def _actor(self) -> Any:
        if self._me is None:
            self._me = ray.get_runtime_context().current_actor
        return self._me

    def run_owners(self) -> set[str]:
        return set(ray.get(self._actor().run_owners.remote()))

    def end_runs_of(self, owners: Iterable[str]) -> list[str]:
        return list(ray.get(self._actor().end_runs_of.remote(sorted(owners), time.time())))

    def forget_ended(self) -> int:
        return int(ray.get(self._actor().forget_ended.remote(time.time())))


class ManagerActor(KVStateManager):
    """The deployment's manager, as a Ray actor: a ``KVStateManager`` that ends the runs of
    clients that are gone and forgets ended runs on time, busy or idle."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        gcs = ray._private.worker.global_worker.gcs_client  # type: ignore[attr-defined]  # NOTE: set when connected
        calls, stop = _CallsOnItself(), threading.Event()  # NOTE: never set: the threads end with the actor
        watch_owners(calls, lambda jobs: gone_jobs(gcs, jobs), stop)
        every(FORGET_CHECK_S, calls.forget_ended, stop, "forget the records of ended runs")
