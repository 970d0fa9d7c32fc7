"""Which workflow runs the KV-state manager has seen begin and end, and when their records go.

A run begun with its client (``begin``: the client's Ray job id) whose client goes away without
ending it is ended for it (``runs_of`` names those; the manager's ``end_runs_of`` ends them); an
ended run's state records are kept
``retain_ended_s`` longer, for lineage queries and recovery plans, then forgotten (``due``). The
manager (``graphflow.kv.manager``) keeps the records; this keeps the runs. Times are passed in.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["RETAIN_ENDED_S", "RunLedger"]

RETAIN_ENDED_S = 600.0


class RunLedger:
    """Running runs and their clients, ended runs and when they ended."""

    def __init__(self, retain_ended_s: float = RETAIN_ENDED_S) -> None:
        if not retain_ended_s >= 0:
            raise ValueError(f"retain_ended_s must be 0 or more seconds, got {retain_ended_s}")
        self.retain_ended_s = retain_ended_s
        self.ended: dict[str, float] = {}  # run → when it ended (its records still kept)
        self.owners: dict[str, str] = {}  # running run → its client's Ray job id (runs that have one)
        self.abandoned = 0  # runs ended for a client that was gone

    def begin(self, run: str, owner: str) -> None:
        """``run`` starts, driven by the client ``owner`` ("" for none: nobody ends it for it)."""
        if owner:
            self.owners[run] = owner

    def running_owners(self) -> set[str]:
        """The clients of the runs begun and not yet ended."""
        return set(self.owners.values())

    def runs_of(self, owners: Iterable[str]) -> list[str]:
        """The running runs of clients that are gone (``owners``), counted as abandoned."""
        gone = set(owners)
        runs = [run for run, owner in self.owners.items() if owner in gone]
        self.abandoned += len(runs)
        return runs

    def end(self, run: str, now_s: float) -> None:
        """``run`` is over: no more admits will name its states."""
        self.owners.pop(run, None)
        self.ended[run] = now_s

    def due(self, now_s: float) -> list[str]:
        """The ended runs whose records go now (ended ``retain_ended_s`` or more before ``now_s``),
        dropped from the ledger."""
        runs = [r for r, ended_s in self.ended.items() if now_s - ended_s >= self.retain_ended_s]
        for r in runs:
            del self.ended[r]
        return runs
