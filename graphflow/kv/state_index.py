"""The states a KV-state manager knows, indexed both ways along their lineage.

A plain class: each :class:`~graphflow.kv.events.StateRecord` by id, and for each state the
states derived from it, so ``ancestors`` (what a state was built from) and ``descendants``
(what was built from it) are walks rather than scans. The manager checks an admit before
adding it; this index only keeps the records and their links.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from graphflow.kv.events import StateRecord

__all__ = ["StateIndex"]


class StateIndex:
    def __init__(self, records: Iterable[StateRecord] = ()) -> None:
        self._records: dict[str, StateRecord] = {}
        self._children: dict[str, set[str]] = {}
        for rec in records:
            self.add(rec)

    def add(self, rec: StateRecord) -> None:
        """Keep ``rec`` and link it under each of its parents."""
        sid = rec.state.state_id
        self._records[sid] = rec
        for p in rec.state.lineage.parents:
            self._children.setdefault(p, set()).add(sid)

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
