"""Prefixes on their way into a replica, so that nodes needing them wait instead of moving them again.

When a node's plan receives blocks, the replica announces the prefix they complete
(:meth:`Arrivals.landed` once they are in its store, or once the receive gave up). A node whose
plan says the prefix is arriving (``NodePlan.await_tokens``: the executor placed it where a
transfer of its prefix was already in flight) waits for that, bounded, before it looks up its
local prefix; if the blocks never land it prefills what is missing, as any node does whose
prefix is gone. Whichever side comes first creates the entry, so the order in which the two
calls reach the replica does not matter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

__all__ = ["Arrivals"]


class Arrivals:
    def __init__(self, clock: Callable[[], float] = time.monotonic, keep_s: float = 300.0) -> None:
        self.clock = clock
        self.keep_s = keep_s  # how long an entry is kept (for a late waiter; a receive never takes this long)
        self._lock = threading.Lock()
        self._entries: dict[tuple[int, ...], tuple[threading.Event, float]] = {}

    def _event(self, tokens: Sequence[int], touch: bool = False) -> threading.Event:
        """The entry of ``tokens``, created if missing (``touch``: its time restarted now)."""
        key, now = tuple(tokens), self.clock()
        with self._lock:
            for k in [k for k, (_, at) in self._entries.items() if now - at > self.keep_s]:
                del self._entries[k]
            ev, at = self._entries.get(key, (threading.Event(), now))
            self._entries[key] = (ev, now if touch else at)
            return ev

    def landed(self, tokens: Sequence[int]) -> None:
        """The receive of the prefix ``tokens`` is over (kept, or given up): wake its waiters."""
        self._event(tokens, touch=True).set()

    def wait(self, tokens: Sequence[int], timeout_s: float) -> bool:
        """Block until the prefix ``tokens`` has landed; False when ``timeout_s`` ran out first."""
        return self._event(tokens).wait(timeout_s)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
