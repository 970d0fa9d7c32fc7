"""The order of a replica's store changes, so the manager never applies an older one over a newer.

A replica's admits and evictions reach the manager inside node results, and each client applies
the results it collects when it collects them: two results of one replica, collected by two
runs (or two clients), can arrive in the other order. Applied as they arrive, an eviction of a
block applied before the older admit that stored it leaves the manager listing a block the
replica no longer holds (later runs then plan reuse and transfers of it), and an older eviction
applied after a newer admit of the same block hides a block the replica holds.

So the replica stamps every change with a number that only grows (:class:`Stamps`: nanoseconds
of the wall clock, one more than the last when the clock has not moved), and the manager
remembers, per replica, the stamp of the last change it applied to each recently changed block
and whether it left the block there (:class:`CopyOrder`). A change older than that one is not
applied to that block: an older eviction is skipped, and an older admit of a block evicted since
records it as gone. Only the last :data:`KEYS_REMEMBERED` blocks changed on a replica are
remembered (results come back milliseconds apart, far inside that window). Past it, a change
older than the newest one forgotten, to a block no longer remembered, may be older than that
block's last change, so it is taken the safe way (:meth:`CopyOrder.unsure`): an eviction is
applied (at worst the manager misses a copy the replica holds) and an admit records the block
gone unless the manager lists it there already (it never adds a copy that may be gone). A
change stamped 0 (from code that does not stamp) is applied as it arrives. A stamp is the wall
clock's, so a replica restarted under the same name counts on from where it was (unless the
clock was set back meanwhile).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

__all__ = ["KEYS_REMEMBERED", "CopyOrder", "Stamps"]

KEYS_REMEMBERED = 1 << 16  # blocks per replica whose last applied change the manager remembers


class Stamps:
    """A replica's change stamps: each call returns a number larger than every one before.

    Args:
        clock_ns: nanoseconds of a clock that survives restarts (the wall clock).
    """

    def __init__(self, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.clock_ns = clock_ns
        self._last = 0

    def __call__(self) -> int:
        self._last = max(self._last + 1, self.clock_ns())
        return self._last


class CopyOrder:
    """Per replica, the stamp of the last change applied to each recently changed block."""

    def __init__(self, keys_remembered: int = KEYS_REMEMBERED) -> None:
        if keys_remembered < 1:
            raise ValueError(f"keys_remembered must be 1 or more, got {keys_remembered}")
        self.keys_remembered = keys_remembered
        self._last: dict[str, OrderedDict[int, tuple[int, bool]]] = {}  # replica → key → (stamp, held)
        self._forgotten: dict[str, int] = {}  # replica → the newest stamp among the changes forgotten

    def newer(self, replica: str, keys: Iterable[int], stamp: int) -> dict[int, bool]:
        """The ``keys`` of which a change newer than ``stamp`` was already applied on ``replica``,
        each with whether that change left the block there (none when ``stamp`` is 0: an
        unstamped change is applied as it comes)."""
        seen = self._last.get(replica)
        if not stamp or not seen:
            return {}
        out: dict[int, bool] = {}
        for k in keys:
            last = seen.get(k)
            if last is not None and last[0] > stamp:
                out[k] = last[1]
        return out

    def unsure(self, replica: str, keys: Iterable[int], stamp: int) -> list[int]:
        """The ``keys`` whose last change on ``replica`` is no longer remembered and may be newer
        than ``stamp`` (a change newer than ``stamp`` was forgotten): an admit records gone those
        the manager does not list already, an eviction is applied."""
        if not stamp or stamp >= self._forgotten.get(replica, 0):
            return []
        seen: dict[int, tuple[int, bool]] = self._last.get(replica, {})
        return [k for k in keys if k not in seen]

    def applied(self, replica: str, keys: Iterable[int], stamp: int, held: bool) -> None:
        """A change stamped ``stamp`` was applied to ``keys`` on ``replica``, leaving them there
        (``held``: an admit) or not (an eviction). Keys it is :meth:`unsure` of stay unsure."""
        if not stamp:
            return
        seen = self._last.setdefault(replica, OrderedDict())
        forgotten = self._forgotten.get(replica, 0)
        for k in keys:
            last = seen.get(k)
            if (last is None and stamp >= forgotten) or (last is not None and last[0] < stamp):
                seen[k] = (stamp, held)
                seen.move_to_end(k)
        while len(seen) > self.keys_remembered:
            _, (old, _) = seen.popitem(last=False)
            forgotten = max(forgotten, old)
        if forgotten:
            self._forgotten[replica] = forgotten

    def forget(self, replica: str) -> None:
        """``replica`` was dropped (it died): what the manager holds for it starts anew. A resync
        keeps the order, so a stale change arriving after it cannot undo its stamped admits."""
        self._last.pop(replica, None)
        self._forgotten.pop(replica, None)

    def remembered(self, replica: str) -> int:
        return len(self._last.get(replica, ()))
