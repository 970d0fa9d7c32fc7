"""Ending the runs of clients that are gone.

A replica protects from eviction the states a ready node of a running workflow needs, until the
executor that runs it calls ``end_run``. A client killed or cut off mid-run never calls it, so
without this its states stayed protected for the replica's life (seen: seven states of a
client killed with SIGKILL still protected 70 s later, with nothing left to end them). Each
node plan names its client (``NodePlan.owner``, the Ray job id of the process that drives the
executor); every :data:`OWNER_CHECK_S` the replica actor asks Ray which of the clients of its
recorded runs have ended and ends their runs (``ReplicaWorker.end_runs_of``). Ray marks a
Ray-client connection's job dead when its per-client server exits, about 30 s after the client
is lost (Ray's reconnect grace), so the states are released within a minute of that. The KV
manager's actor does the same for the runs' records (``runtime.manager_actor``): the executor
tells it each run's client when the run begins. A plan without an owner (the in-process cluster
of the tests and ``LocalCluster``) is never ended this way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from graphflow.runtime.periodic import every

__all__ = ["OWNER_CHECK_S", "end_gone_owners", "gone_jobs", "watch_owners"]

OWNER_CHECK_S = 15.0
WATCH = "end the runs of clients that are gone"


class _Owned(Protocol):
    def run_owners(self) -> set[str]: ...
    def end_runs_of(self, owners: Iterable[str]) -> list[str]: ...


def end_gone_owners(replica: _Owned, gone: Callable[[set[str]], set[str]]) -> list[str]:
    """End the runs whose client ``gone`` reports ended; returns those runs. ``gone`` is asked
    only when some run names its client."""
    owners = replica.run_owners()
    if not owners:
        return []
    ended = gone(owners)
    return replica.end_runs_of(ended) if ended else []


def gone_jobs(gcs: Any, job_ids: set[str]) -> set[str]:
    """Of ``job_ids`` (Ray job ids, hex), those whose driver Ray's job table marks dead; an id
    it does not list counts as alive. ``gcs``: the worker's GCS client."""
    gone = set()
    for job in job_ids:
        # NOTE: the GCS client Ray's own job manager uses (ray._private, not public API); one
        # lookup per client, skipping the fields that cost the GCS a round to the drivers
        found = gcs.get_all_job_info(
            job_or_submission_id=job, skip_submission_job_info_field=True, skip_is_running_tasks_field=True
        )
        if any(job_id.hex() == job and info.is_dead for job_id, info in found.items()):
            gone.add(job)
    return gone


def watch_owners(
    replica: _Owned,
    gone: Callable[[set[str]], set[str]],
    stop: threading.Event,
) -> threading.Thread:
    """A daemon thread that calls :func:`end_gone_owners` every :data:`OWNER_CHECK_S` until
    ``stop`` is set. A lookup that fails is logged once and retried at the next check; until one
    succeeds the runs stay as they are (protected, recorded), as they were before this existed."""
    return every(OWNER_CHECK_S, lambda: end_gone_owners(replica, gone), stop, WATCH)
