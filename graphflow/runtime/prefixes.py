"""Stored prefixes that running nodes continue, each held once however many nodes read it.

The engine loop's rows attend over a :class:`~graphflow.models.ragged.SharedPrefix` (a chain
of stored blocks, read in place on the CPU) plus their own suffix. Nodes that continue the
same chain at once (agents fanning out from one context) get the same prefix; it is dropped
when the last of them finishes. Every prefix is gathered a layer at a time into the engine
loop thread's one gather buffer (``ragged._gather_buffer``).
"""

from __future__ import annotations

import threading

from graphflow.kv.block import KVBlock
from graphflow.kv.packing import validate_chain
from graphflow.models.engine import Engine
from graphflow.models.ragged import SharedPrefix

__all__ = ["SharedPrefixes"]


class SharedPrefixes:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._held: dict[int, tuple[SharedPrefix, int]] = {}  # last block key → (prefix, readers)
        self._lock = threading.Lock()
        self.built = 0  # prefixes made (a reader of a held prefix makes none)

    def acquire(self, blocks: list[KVBlock]) -> SharedPrefix:
        """The prefix of ``blocks`` (a chain from position 0, checksums verified by the caller)."""
        if not blocks:
            raise ValueError("a shared prefix needs at least one block")
        key = blocks[-1].key
        with self._lock:
            if key in self._held:
                prefix, readers = self._held[key]
                self._held[key] = (prefix, readers + 1)
                return prefix
            validate_chain(blocks, self.engine.identity, verify_bytes=False)
            prefix = SharedPrefix([b.tensor for b in blocks], self.engine.device)
            self._held[key] = (prefix, 1)
            self.built += 1
            return prefix

    def release(self, blocks: list[KVBlock]) -> None:
        key = blocks[-1].key
        with self._lock:
            prefix, readers = self._held[key]
            if readers == 1:
                del self._held[key]
            else:
                self._held[key] = (prefix, readers - 1)
