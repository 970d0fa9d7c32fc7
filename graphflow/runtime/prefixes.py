"""Stored prefixes that running nodes continue, each held once however many nodes read it.

The engine loop's rows attend over a :class:`~graphflow.models.ragged.SharedPrefix` (one
contiguous copy of a chain of stored blocks) plus their own suffix. Nodes that continue the
same chain at once (agents fanning out from one context) get the same copy; it is freed when
the last of them finishes.
"""

from __future__ import annotations

import threading

import torch

from graphflow.kv.block import KVBlock
from graphflow.kv.packing import validate_chain
from graphflow.models.engine import Engine
from graphflow.models.ragged import SharedPrefix
from transport.memory import host_arena

__all__ = ["SharedPrefixes"]


class SharedPrefixes:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._held: dict[int, tuple[SharedPrefix, int]] = {}  # last block key → (prefix, readers)
        self._lock = threading.Lock()
        self.built = 0  # copies made (a reader of a held prefix makes none)

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
            prefix = SharedPrefix.from_tensor(self._joined(blocks), self.engine.device)
            self._held[key] = (prefix, 1)
            self.built += 1
            return prefix

    def _joined(self, blocks: list[KVBlock]) -> torch.Tensor:
        """The blocks' tensors as one, along the tokens. On the CPU it lands in the host arena,
        whose slabs of a size are kept and handed out again: the next prefix of that size (the
        next agent over a context of that length) lands in pages already faulted in, where fresh
        memory costs its first touch (~1 ms per MiB here, more than the copy)."""
        parts = [b.tensor for b in blocks]
        if torch.device(self.engine.device).type != "cpu":
            return torch.cat(parts, dim=3)
        shape = list(parts[0].shape)
        shape[3] = sum(p.shape[3] for p in parts)
        return torch.cat(parts, dim=3, out=host_arena().empty(shape, parts[0].dtype))

    def release(self, blocks: list[KVBlock]) -> None:
        key = blocks[-1].key
        with self._lock:
            prefix, readers = self._held[key]
            if readers == 1:
                del self._held[key]
            else:
                self._held[key] = (prefix, readers - 1)
