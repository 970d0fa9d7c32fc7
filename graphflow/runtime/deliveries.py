"""Which of a replica's store changes the manager has heard of (a plain class, no store or I/O).

A replica's changes reach the manager inside its results: the executor applies a node's admit
and evictions when it collects the result. A result nobody collects (its run timed out or failed
while the node was queued or running) would leave the manager wrong: the states that node kept
stay on the replica, unprotected and unknown, and the states it evicted to make room stay listed
there, so later runs plan reuse and transfers of blocks that are gone.

So the executor ends a run with the ids of the states whose results it delivered
(``ReplicaWorker.end_run(run, delivered)``), and the replica:

```
result returned ─► sent(state, kept, evictions)      remembered per run until it ends
end_run(run, delivered) ─► for each sent state not delivered:
                              release what it kept; its evictions and the releases ─► waiting
node finished after its run ended ─► keep nothing; its evictions and releases ─► waiting
node failed ─► the evictions it made ─► waiting
send found blocks gone ─► their eviction ─► waiting    (the manager listed them here)
next result of any run ─► carries take() (waiting evictions of blocks it no longer
                           holds), then its own events
every few seconds ─► the replica actor hands take() to the manager itself (put_back if
                     that fails), for a replica that gets no further call
```

so every eviction reaches the manager, late, with the replica's next result or within seconds,
and what the manager never heard of does not stay. A release is reported as an eviction of the
blocks it freed, which the manager may never have known (applying one is then a no-op).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace

from graphflow.kv.events import EvictEvent
from graphflow.kv.state_index import run_of

__all__ = ["RUNS_TRACKED", "Deliveries"]

RUNS_TRACKED = 4096  # runs whose returned results a replica remembers until they end (oldest forgotten)


@dataclass(frozen=True, slots=True)
class _Sent:
    kept: tuple[str, ...]  # states the call stored, which its result's admit announces
    evicted: tuple[EvictEvent, ...]  # every eviction the result carried (waiting ones included)


class Deliveries:
    """The results a replica returned for runs not ended yet, and the evictions waiting for a result."""

    def __init__(self) -> None:
        self._sent: OrderedDict[str, dict[str, _Sent]] = OrderedDict()  # run → state id → what it told
        self._waiting: list[EvictEvent] = []
        self.released = 0  # states released because their results never reached the manager

    def sent(self, state_id: str, kept: Iterable[str], evicted: Iterable[EvictEvent]) -> None:
        """A result for ``state_id`` was returned, announcing ``kept`` and ``evicted``. A state
        of no run (no ``run:`` prefix) is not remembered: no run end will ask about it."""
        run = run_of(state_id)
        if not run:
            return
        self._sent.setdefault(run, {})[state_id] = _Sent(tuple(kept), tuple(evicted))
        self._sent.move_to_end(run)
        while len(self._sent) > RUNS_TRACKED:
            self._sent.popitem(last=False)

    def end_run(self, run_id: str, delivered: Collection[str]) -> list[str]:
        """``run_id`` ended, its executor having delivered the results of ``delivered``; the
        others' evictions wait for a later result. Returns the states those others kept, for
        the caller to release (and :meth:`wait` for those releases). Forgets the run."""
        lost: list[str] = []
        for sid, sent in self._sent.pop(run_id, {}).items():
            if sid not in delivered:
                lost += sent.kept
                self._waiting += sent.evicted
        return lost

    def forget(self, run_id: str) -> None:
        """Stop remembering ``run_id``'s results (its client is gone: what it delivered is unknown,
        and its states stay as any cached state does)."""
        self._sent.pop(run_id, None)

    def wait(self, evicted: Iterable[EvictEvent], released: int = 0) -> None:
        """Evictions no returned result carries: the next result will. ``released``: how many
        of them released states whose results never reached the manager (counted)."""
        self._waiting += evicted
        self.released += released

    def put_back(self, evicted: Iterable[EvictEvent]) -> None:
        """Evictions :meth:`take` gave out for a report that did not reach the manager: they
        wait again, ahead of those that came since."""
        self._waiting[:0] = evicted

    def take(self, holds: Callable[[int], bool]) -> tuple[EvictEvent, ...]:
        """The waiting evictions, oldest first, for the result about to be returned, less the
        blocks the replica holds again (``holds(key)``): an eviction that waited may be older
        than a delivered admit of the same block, and must not undo it."""
        out: list[EvictEvent] = []
        for ev in self._waiting:
            gone = tuple(k for k in ev.keys if not holds(k))
            if gone:
                out.append(replace(ev, keys=gone) if len(gone) < len(ev.keys) else ev)
        self._waiting = []
        return tuple(out)

    def runs(self) -> int:
        """Runs with returned results remembered."""
        return len(self._sent)

    def waiting(self) -> int:
        """Evictions waiting for a result."""
        return len(self._waiting)
