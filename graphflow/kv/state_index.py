"""The states a KV-state manager knows, indexed both ways along their lineage.

A plain class: each :class:`~graphflow.kv.events.StateRecord` by id, and for each state the
states derived from it, so ``ancestors`` (what a state was built from) and ``descendants``
(what was built from it) are walks rather than scans. The manager checks an admit before
adding it; this index only keeps the records and their links. A run's states (ids
``run:node``, as the executor names them, and ``run:node:transfer``, a node's received prefix)
can be forgotten together once the run is over (:meth:`forget_run`), so the index holds what
runs now, not every state ever served.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from graphflow.kv.events import StateRecord

__all__ = ["StateIndex", "run_of", "transfer_state"]

_TRANSFER = ":transfer"


def transfer_state(state_id: str) -> str:
    """The state a node keeps of its own prefix plus the blocks it received, apart from its
    own state ``state_id`` (``run:node:transfer``)."""
    return state_id + _TRANSFER


def run_of(state_id: str) -> str:
    """The run a state belongs to: ``run`` of ``run:node`` and of ``run:node:transfer`` ('' for
    an id without one)."""
    return state_id.removesuffix(_TRANSFER).rpartition(":")[0]


class StateIndex:
    def __init__(self, records: Iterable[StateRecord] = ()) -> None:
        self._records: dict[str, StateRecord] = {}
        self._children: dict[str, set[str]] = {}
        self._runs: dict[str, list[str]] = {}  # run → its state ids, in admission order
        for rec in records:
            self.add(rec)

    def add(self, rec: StateRecord) -> None:
        """Keep ``rec`` and link it under each of its parents."""
        sid = rec.state.state_id
        self._records[sid] = rec
        for p in rec.state.lineage.parents:
            self._children.setdefault(p, set()).add(sid)
        if run_of(sid):
            self._runs.setdefault(run_of(sid), []).append(sid)

    def forget_run(self, run: str) -> int:
        """Drop the records of ``run``'s states, except those another run's state was derived
        from (with their ancestors in the run), so every kept record's parents stay known.
        Returns how many records were dropped."""
        ids = self._runs.pop(run, [])
        members = set(ids)
        kept: set[str] = set()
        for sid in ids:
            if self._children.get(sid, set()) - members:
                kept.add(sid)
                kept.update(a for a in self.ancestors(sid) if a in members)
        gone = [sid for sid in ids if sid not in kept]
        for sid in gone:
            for p in self._records.pop(sid).state.lineage.parents:
                siblings = self._children.get(p)
                if siblings is not None:
                    siblings.discard(sid)
                    if not siblings:
                        del self._children[p]
            self._children.pop(sid, None)
        if kept:
            self._runs[run] = [sid for sid in ids if sid in kept]
        return len(gone)

    def __contains__(self, state_id: object) -> bool:
        return state_id in self._records

    def __iter__(self) -> Iterator[StateRecord]:
        return iter(self._records.values())

    def __len__(self) -> int:
        return len(self._records)

    def get(self, state_id: str) -> StateRecord:
        """The record of ``state_id``; ``ValueError`` for a state never admitted."""
        rec = self._records.get(state_id)
        if rec is None:
            raise ValueError(f"unknown state {state_id!r}")
        return rec

    def ancestors(self, state_id: str) -> list[str]:
        """All states ``state_id`` was derived from, nearest first (breadth-first)."""
        out: list[str] = []
        frontier = list(self.get(state_id).state.lineage.parents)
        while frontier:
            s = frontier.pop(0)
            if s not in out:
                out.append(s)
                frontier.extend(self._records[s].state.lineage.parents)
        return out

    def descendants(self, state_id: str) -> list[str]:
        """All states derived from ``state_id``, nearest first (breadth-first, by id within a level)."""
        self.get(state_id)
        out: list[str] = []
        frontier = sorted(self._children.get(state_id, ()))
        while frontier:
            s = frontier.pop(0)
            if s not in out:
                out.append(s)
                frontier.extend(sorted(self._children.get(s, ())))
        return out
