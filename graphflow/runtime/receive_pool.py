"""The memory a replica faults in at start for the KV it will receive, handed back as the KV it
computes fills the store.

``graphflow serve`` faults in the whole KV capacity at start (``--prefault-mib``,
:meth:`transport.memory.HostArena.reserve`): idle 8 MiB spans that a transfer's data messages
land in and stay in as the received state, so a receive writes into touched memory. The KV a
replica computes does not go there: each node's cache is a room of its own
(``models/row_cache.py``) that becomes its stored blocks. A pool left whole beside a
store full of computed states held about twice the capacity (measured in ``transport/README.md``).

So the pool yields. Before a node computes, the replica asks the pool to keep idle at most the
store's room left once what is stored and what is being computed now is counted::

    idle pool  <=  capacity - used - computing

and the spans over it are freed, their pages handed back to the OS. The pool never grows back:
receives past it land in fresh memory, and their buffers are then recycled by the arena as any
other's. Replicas that share a process (local deployments, tests) share its arena, and so one
pool: each bounds it by its own store, and what one frees may be spans another reserved.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from graphflow.kv.store import BlockStore
from transport.memory import HostArena

__all__ = ["ReceivePool"]


class ReceivePool:
    """A replica's prefaulted receive memory (see the module doc).

    Args:
        arena: the process's block arena, which keeps the pool's spans.
        nbytes: memory to fault in now (at most the store's capacity; 0: no pool).
        store: the replica's block store, whose free room bounds the pool's idle spans.
        recycle_bytes: idle arena memory kept beside the pool for recycling receive buffers.
    """

    def __init__(self, arena: HostArena, nbytes: int, store: BlockStore, recycle_bytes: int) -> None:
        pool = min(nbytes, store.capacity_bytes)
        # NOTE: the recycling room is kept beside the pool, not in it: a pool of the whole room
        # left nothing to recycle, so each receive landed in fresh pages
        arena.keep_bytes = max(arena.keep_bytes, pool + recycle_bytes)
        reserved = arena.reserve(pool)
        self.arena, self.store = arena, store
        self.prefaulted_bytes, self.short = reserved.nbytes, reserved.why_not
        self.freed_bytes = 0
        self._computing = 0
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        """Bytes of the pool still faulted in (idle or holding received KV)."""
        return self.prefaulted_bytes - self.freed_bytes

    @contextmanager
    def computing(self, nbytes: int) -> Iterator[None]:
        """Around a node computing ``nbytes`` of KV: the pool first yields what the store
        could not hold beside it."""
        with self._lock:
            self._computing += nbytes
            if self.held_bytes > 0:
                room = self.store.capacity_bytes - self.store.used_bytes - self._computing
                freed = self.arena.shrink_reserved(room)
                # NOTE: in a shared arena the spans freed may be another replica's (module doc)
                self.freed_bytes = min(self.prefaulted_bytes, self.freed_bytes + freed)
        try:
            yield
        finally:
            with self._lock:
                self._computing -= nbytes
