"""A replica's stored KV: its :class:`~graphflow.kv.store.BlockStore` and the states it keeps.

Adding a state evicts others when it does not fit, lowest eviction score first
(``runtime.kept``), never a state a ready node needs; a stored block is verified before it is
reused or shared, and a corrupt one takes every state holding it with it. Each change comes
back as the manager's events (admits, evictions), stamped in the order they happened
(``graphflow.kv.copy_order``: results reach the manager in any order). The replica runs
several calls at once: every method here holds ``lock`` (re-entrant, so a caller may hold it
around several).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from graphflow.kv.block import KVBlock
from graphflow.kv.copy_order import Stamps
from graphflow.kv.errors import ChecksumMismatch
from graphflow.kv.keys import chain_keys
from graphflow.kv.manager import AdmitEvent, EvictEvent, StateRecord, batch_from_blocks
from graphflow.kv.operators import evict as evict_state
from graphflow.kv.state import Lineage
from graphflow.kv.store import BlockStore
from graphflow.runtime.kept import KeptStates

__all__ = ["ReplicaStore"]


class ReplicaStore:
    def __init__(self, store: BlockStore, held: KeptStates, replica: str, model_key: str, block_tokens: int) -> None:
        self.store = store
        self.held = held
        self.replica = replica
        self.model_key = model_key
        self.block_tokens = block_tokens
        self.lock = threading.RLock()
        self.stamp = Stamps()  # NOTE: called under lock, so stamps follow the order of the changes

    def store_state(
        self, computed: list[Any], lineage: Lineage, state_id: str, tokens: Sequence[int]
    ) -> tuple[AdmitEvent | None, list[EvictEvent]]:
        """Add a state, evicting others (see the module docstring) when the store is full.

        A state that cannot fit without evicting a protected one, or that is larger than the
        whole store, is not kept (the node's output is still valid; the state will be
        recomputed when needed): the store never exceeds its budget. One larger than the whole
        store evicts nothing.
        """
        with self.lock:
            evicted: list[EvictEvent] = []
            for b in computed:  # a stored copy that went corrupt is dropped, not shared
                if self.store.has_block(b.key):
                    try:
                        self.store.block(b.key).verify()
                    except ChecksumMismatch:
                        evicted += self.drop_block(b.key)
            if sum({b.key: b.nbytes for b in computed}.values()) > self.store.capacity_bytes:
                return None, evicted  # larger than the whole store: evicting the others would not fit it
            while True:
                # NOTE: a block this store already holds keeps its stored bytes (first writer
                # wins, as in vLLM's prefix cache): the same tokens recomputed along another path
                # differ only by rounding, and one key never maps to two versions on a replica.
                blocks = [self.store.block(b.key) if self.store.has_block(b.key) else b for b in computed]
                need = sum({b.key: b.nbytes for b in blocks if not self.store.has_block(b.key)}.values())
                if self.store.can_allocate(need):
                    break
                victim = self.held.victim(self.freed_bytes)
                if victim is None:
                    break
                evicted.append(self.evict(victim))
            state = self.store.add_state(blocks, lineage, state_id)  # None: it does not fit
            if state is None:
                return None, evicted
            self.held.add(state_id)
            return self.admit_event(state_id, tokens), evicted

    def freed_bytes(self, state_id: str) -> int:
        """Bytes that releasing ``state_id`` would free (blocks no other state holds)."""
        return sum(b.nbytes for b in self.store.blocks(state_id) if self.store.refcount(b.key) == 1)

    def admit_event(self, state_id: str, tokens: Sequence[int]) -> AdmitEvent:
        """The admit for a stored state, listing every block of it, not only new ones: the manager
        must learn that this replica holds blocks it received or already had (it skips copies it
        knows)."""
        blocks = self.store.blocks(state_id)
        unique = list({b.key: b for b in blocks}.values())
        record = StateRecord.of(self.store.state(state_id), tokens)
        return AdmitEvent(self.replica, record, batch_from_blocks(unique, self.replica, state_id), self.stamp())

    def evict(self, state_id: str) -> EvictEvent:
        self.held.remove(state_id)
        freed = tuple(k for k in self.store.state(state_id).block_keys if self.store.refcount(k) == 1)
        evict_state(self.store, state_id)
        return EvictEvent(self.replica, freed, state_id, self.stamp())

    def local_prefix(self, ids: list[int], limit: int, leave: int = 1) -> tuple[list[KVBlock], list[EvictEvent]]:
        """Leading full blocks of ``ids[:limit]`` this store holds, leaving ≥ ``leave`` tokens
        to prefill (a node needs its last token's logits; a materialized state needs none).

        Each block's checksum is verified before reuse; a corrupt block is never reused: the
        states holding it are dropped (reported as evictions) and its tokens are recomputed.
        States whose blocks are reused count a hit and are touched (eviction inputs)."""
        bt = self.block_tokens
        usable = min(len(ids) - leave, limit) // bt * bt
        keys = chain_keys(ids[:usable], self.model_key, bt)
        out: list[KVBlock] = []
        with self.lock:
            for k in keys:
                if not self.store.has_block(k):
                    break
                block = self.store.block(k)
                try:
                    block.verify()
                except ChecksumMismatch:
                    return out, self.drop_block(k)
                out.append(block)
            if out:
                self.held.touch(self.holders(out[-1].key))
        return out, []

    def holders(self, key: int) -> list[str]:
        """Kept states that hold block ``key``."""
        return [sid for sid in self.held if key in self.store.state(sid).block_keys]

    def drop_block(self, key: int) -> list[EvictEvent]:
        """Release every state holding ``key`` (a corrupt block); returns the evictions."""
        return [self.evict(sid) for sid in self.holders(key)]

    def clear(self) -> list[EvictEvent]:
        """Evict every kept state except those a ready node needs now; returns the evictions."""
        with self.lock:
            protect = self.held.needed_now()
            return [self.evict(sid) for sid in list(self.held) if sid not in protect]

    def holdings(self) -> list[AdmitEvent]:
        """Every kept state, oldest first, as admits (what a restarted manager re-learns)."""
        with self.lock:
            return [
                self.admit_event(sid, [t for b in self.store.blocks(sid) for t in b.token_ids]) for sid in self.held
            ]
