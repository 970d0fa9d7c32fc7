"""The states a replica keeps and which one it evicts next (a plain class, no store or I/O).

Score eviction (default): the kept state with the lowest ``scheduler.eviction`` score goes
first — hits, bytes its release frees, seconds since last use, and the running workflows'
steps until a node needs it — and a state a ready node needs (steps 0) is never chosen.
``oldest`` is the order replicas used before (an ablation): first kept, first evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from scheduler.eviction import EvictionWeights, eviction_scores

__all__ = ["ENDED_RUNS_KEPT", "EVICTION_POLICIES", "KeptStates", "check_policy"]

EVICTION_POLICIES = ("score", "oldest")
ENDED_RUNS_KEPT = 4096  # ended run ids a replica remembers (a late plan of one of them protects nothing)


def check_policy(name: str) -> str:
    """``name`` if it is an eviction policy, else a ``ValueError`` that lists them."""
    if name not in EVICTION_POLICIES:
        raise ValueError(f"unknown eviction policy {name!r}; use one of {', '.join(EVICTION_POLICIES)}")
    return name


@dataclass(slots=True)
class _Held:
    last_used_s: float
    hits: int = 0


class KeptStates:
    """Args: ``policy`` one of :data:`EVICTION_POLICIES`; ``clock`` seconds (ages)."""

    def __init__(self, policy: str, clock: Callable[[], float], weights: EvictionWeights | None = None) -> None:
        self.policy = check_policy(policy)
        self.clock = clock
        self.weights = weights or EvictionWeights()
        self._held: dict[str, _Held] = {}  # oldest first
        self._next_use: dict[str, dict[str, int]] = {}  # run id → state id → steps until a node needs it
        self._owner: dict[str, str] = {}  # run id → the client that runs it ('' = unknown)
        # NOTE: runs ended lately: a node plan of one that reaches this replica after its end (queued
        # behind others while its run failed or timed out) must not protect states again, for good
        self._ended: OrderedDict[str, None] = OrderedDict()

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, state_id: object) -> bool:
        return state_id in self._held

    def add(self, state_id: str) -> None:
        self._held[state_id] = _Held(self.clock())

    def remove(self, state_id: str) -> None:
        """Forget ``state_id`` (a no-op if it is not kept)."""
        self._held.pop(state_id, None)

    def touch(self, state_ids: Iterable[str]) -> None:
        """The states were reused: one hit each, used now."""
        now = self.clock()
        for sid in state_ids:
            held = self._held[sid]
            held.hits += 1
            held.last_used_s = now

    def note_next_use(self, run_id: str, steps: Iterable[tuple[str, int]], owner: str = "") -> None:
        """A run's latest view of when its states are needed (empty: the run needs none);
        ``owner`` names the client running it, for :meth:`end_runs_of`."""
        table = dict(steps)
        if table and run_id in self._ended:
            return
        if table:
            self._next_use[run_id] = table
            self._owner[run_id] = owner
        else:
            self._next_use.pop(run_id, None)
            self._owner.pop(run_id, None)

    def end_run(self, run_id: str) -> None:
        """``run_id`` is over: its states stop being protected, and a plan of it that arrives
        later protects nothing (the last :data:`ENDED_RUNS_KEPT` ended runs are remembered)."""
        self.note_next_use(run_id, ())
        self._ended[run_id] = None
        self._ended.move_to_end(run_id)
        while len(self._ended) > ENDED_RUNS_KEPT:
            self._ended.popitem(last=False)

    def ended(self, run_id: str) -> bool:
        """Whether ``run_id`` ended lately (one of the last :data:`ENDED_RUNS_KEPT` ended)."""
        return run_id in self._ended

    def run_owners(self) -> set[str]:
        """The clients of the runs whose next uses are recorded (unknown ones left out)."""
        return {o for o in self._owner.values() if o}

    def end_runs_of(self, owners: Iterable[str]) -> list[str]:
        """Forget the next uses of every run of ``owners`` (clients that are gone and will never
        end their runs): their states stop being protected. Returns the run ids forgotten."""
        gone = set(owners)
        runs = [r for r, o in self._owner.items() if o and o in gone]
        for r in runs:
            self.end_run(r)
        return runs

    def needed_now(self) -> set[str]:
        """States a node that is ready now will read (its plan may already be on the way)."""
        return {s for s, steps in self._soonest().items() if steps == 0}

    def victim(self, freed_bytes: Callable[[str], int]) -> str | None:
        """The kept state to evict next (``freed_bytes(s)``: what releasing it frees), or
        ``None`` when every one is protected. ``oldest`` protects nothing."""
        if self.policy == "oldest":
            return next(iter(self._held), None)
        protect = self.needed_now()
        names = [s for s in self._held if s not in protect]
        if not names:
            return None
        now, soon = self.clock(), self._soonest()
        scores = eviction_scores(
            np.array([self._held[s].hits for s in names]),
            np.array([freed_bytes(s) for s in names]),
            np.array([now - self._held[s].last_used_s for s in names]),
            np.array([soon.get(s, -1) for s in names]),
            self.weights,
        )
        return names[int(np.argmin(scores))]  # NOTE: ties go to the oldest (argmin takes the first)

    def _soonest(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for table in self._next_use.values():
            for sid, steps in table.items():
                out[sid] = min(steps, out.get(sid, steps))
        return out
