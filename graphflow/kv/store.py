"""Per-replica block store: refcounted, content-addressed, copy-on-write.

```
 state A ──► [k0][k1][k2][k3']          refs: k0=2 k1=2 k2=2 k3'=1 k3''=1
 state B ──► [k0][k1][k2][k3'']         (B = fork(A), then both appended to the
                                          shared partial tail k3 → each got a copy)
```

A block is stored once per key however many states use it; ``fork`` adds references, never
bytes; appending to a shared partial tail copies that one block (copy-on-write). Memory is
accounted from the real bytes of the stored tensors; ``check_integrity`` recomputes it.
Capacity failure is a ``None`` return; misuse is ``ValueError``; corruption ``RuntimeError``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from graphflow.kv.block import KVBlock, make_blocks
from graphflow.kv.keys import ROOT_KEY
from graphflow.kv.packing import validate_chain
from graphflow.kv.state import KVState, Lineage, ModelIdentity, Placement, Positions

__all__ = ["BlockStore", "StoreStats"]


@dataclass(slots=True)
class _Slot:
    block: KVBlock
    refs: int


@dataclass(frozen=True, slots=True)
class StoreStats:
    capacity_bytes: int
    used_bytes: int
    free_bytes: int
    num_blocks: int
    num_states: int
    shared_blocks: int
    peak_used_bytes: int


class BlockStore:
    """Blocks and states of one replica, within a byte budget.

    Args:
        identity: the model whose KV this store holds; foreign blocks are refused.
        capacity_bytes: budget for block tensor bytes.
        block_tokens: tokens per full block.
        placement: where this store lives (copied into every state it creates).
    """

    def __init__(
        self,
        identity: ModelIdentity,
        capacity_bytes: int,
        block_tokens: int = 16,
        placement: Placement | None = None,
    ) -> None:
        if capacity_bytes <= 0 or block_tokens <= 0:
            raise ValueError(f"capacity_bytes and block_tokens must be positive, got {capacity_bytes}, {block_tokens}")
        self.identity = identity
        self.capacity_bytes = capacity_bytes
        self.block_tokens = block_tokens
        self.placement = placement or Placement()
        self._slots: dict[int, _Slot] = {}
        self._states: dict[str, KVState] = {}
        self._used = 0
        self._peak = 0
        self._ids = itertools.count()

    # ---- queries -------------------------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self._used

    def can_allocate(self, nbytes: int) -> bool:
        return nbytes <= self.free_bytes

    def state(self, state_id: str) -> KVState:
        try:
            return self._states[state_id]
        except KeyError:
            raise ValueError(f"unknown state {state_id!r}; known: {sorted(self._states)[:10]}") from None

    def blocks(self, state_id: str) -> list[KVBlock]:
        return [self._slots[k].block for k in self.state(state_id).block_keys]

    def block(self, key: int) -> KVBlock:
        """The stored block with this key (``ValueError`` if absent)."""
        slot = self._slots.get(key)
        if slot is None:
            raise ValueError(f"block {key:016x} is not in this store")
        return slot.block

    def has_block(self, key: int) -> bool:
        return key in self._slots

    def refcount(self, key: int) -> int:
        slot = self._slots.get(key)
        return slot.refs if slot else 0

    def stats(self) -> StoreStats:
        return StoreStats(
            capacity_bytes=self.capacity_bytes,
            used_bytes=self._used,
            free_bytes=self.free_bytes,
            num_blocks=len(self._slots),
            num_states=len(self._states),
            shared_blocks=sum(1 for s in self._slots.values() if s.refs > 1),
            peak_used_bytes=self._peak,
        )

    # ---- mutations -----------------------------------------------------------------------
    def add_state(self, blocks: Sequence[KVBlock], lineage: Lineage, state_id: str | None = None) -> KVState | None:
        """Register a state made of ``blocks`` (a chain from position 0).

        Blocks whose key is already stored are shared, not copied. Returns ``None`` (and
        changes nothing) when the new bytes do not fit.

        Raises:
            IncompatibleState: blocks of another model.
            ChecksumMismatch: a block's bytes do not match its checksum.
            ValueError: a broken chain, a duplicate ``state_id``, or a stored key whose bytes differ.
        """
        validate_chain(blocks, self.identity)
        state_id = state_id or self._new_id()
        if state_id in self._states:
            raise ValueError(f"state {state_id!r} already exists; pick another id or release it first")
        new_bytes = 0
        for b in blocks:
            slot = self._slots.get(b.key)
            if slot is None:
                new_bytes += b.nbytes
            elif slot.block.checksum != b.checksum:
                raise ValueError(
                    f"block {b.key:016x} is already stored with checksum {slot.block.checksum:016x}, "
                    f"offered with {b.checksum:016x}; refusing to mix bytes under one key"
                )
        if not self.can_allocate(new_bytes):
            return None
        for b in blocks:
            self._ref(b)
        n = blocks[-1].token_range[1] if blocks else 0
        state = KVState(
            state_id=state_id,
            model_id=self.identity.model_id,
            config_hash=self.identity.config_hash,
            block_keys=tuple(b.key for b in blocks),
            position=Positions(offset=0, num_tokens=n, rope=self.identity.rope),
            lineage=lineage,
            placement=self.placement,
        )
        self._states[state_id] = state
        return state

    def fork(self, state_id: str, k: int) -> list[KVState]:
        """``k`` children of a state sharing all of its blocks (no bytes are copied)."""
        if k <= 0:
            raise ValueError(f"fork needs k >= 1, got {k}")
        parent = self.state(state_id)
        children = []
        for _ in range(k):
            child = replace(parent, state_id=self._new_id(), lineage=Lineage("fork", (state_id,)))
            for key in parent.block_keys:
                self._slots[key].refs += 1
            self._states[child.state_id] = child
            children.append(child)
        return children

    def append(self, state_id: str, token_ids: Sequence[int], kv: torch.Tensor) -> KVState | None:
        """Extend a state by new tokens' KV ``[layers, 2, kv_heads, n, head_dim]``.

        A partial tail block is completed into a new block (copy-on-write: the old tail stays
        for any other state that shares it, and is freed if no one does). Returns the updated
        state, or ``None`` (nothing changed) when the new bytes do not fit.
        """
        state = self.state(state_id)
        if kv.shape[3] != len(token_ids):
            raise ValueError(f"kv holds {kv.shape[3]} tokens but {len(token_ids)} token ids were given")
        keys = list(state.block_keys)
        tail = self._slots[keys[-1]].block if keys else None
        rewrite_tail = tail is not None and tail.num_tokens < self.block_tokens
        if tail is not None and rewrite_tail:
            keys.pop()
            ids = list(tail.token_ids) + list(token_ids)
            kv = torch.cat((tail.tensor, kv.to(tail.tensor.dtype)), dim=3)
            start, parent = tail.position_offset, tail.parent_key
        else:
            ids = list(token_ids)
            start, parent = state.position.end, (tail.key if tail else ROOT_KEY)
        new_blocks = make_blocks(parent, ids, start, kv, self.identity.model_key, self.block_tokens)
        new_bytes = sum(b.nbytes for b in new_blocks if b.key not in self._slots)
        freed = tail.nbytes if (tail is not None and rewrite_tail and self.refcount(tail.key) == 1) else 0
        if not self.can_allocate(new_bytes - freed):
            return None
        if tail is not None and rewrite_tail:
            self._unref(tail.key)  # NOTE: before _ref, so the peak never counts both copies
        for b in new_blocks:
            self._ref(b)
        updated = replace(
            state,
            block_keys=tuple(keys) + tuple(b.key for b in new_blocks),
            position=replace(state.position, num_tokens=state.num_tokens + len(token_ids)),
        )
        self._states[state_id] = updated
        return updated

    def release(self, state_id: str) -> int:
        """Drop a state; blocks no other state uses are freed. Returns the bytes freed."""
        state = self._states.pop(state_id, None)
        if state is None:
            raise ValueError(f"unknown state {state_id!r}; nothing released")
        before = self._used
        for key in state.block_keys:
            self._unref(key)
        return before - self._used

    # ---- invariants ----------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Verify accounting and refcounts; raises ``RuntimeError`` on any inconsistency."""
        refs: dict[int, int] = {}
        for st in self._states.values():
            for key in st.block_keys:
                refs[key] = refs.get(key, 0) + 1
        if refs != {k: s.refs for k, s in self._slots.items()}:
            raise RuntimeError("block refcounts do not match the states that reference them")
        # NOTE: block tensors are views into shared slab spans (transport.memory); the store
        # accounts each block's own bytes
        real = sum(s.block.tensor.numel() * s.block.tensor.element_size() for s in self._slots.values())
        if real != self._used:
            raise RuntimeError(f"accounted {self._used} bytes but stored tensors hold {real}")
        if not all(s.block.tensor.is_contiguous() for s in self._slots.values()):
            raise RuntimeError("a stored block tensor is not contiguous")
        if self.free_bytes + self._used != self.capacity_bytes or self._used > self.capacity_bytes:
            raise RuntimeError(f"free {self.free_bytes} + used {self._used} != capacity {self.capacity_bytes}")

    # ---- helpers -------------------------------------------------------------------------
    def _ref(self, block: KVBlock) -> None:
        slot = self._slots.get(block.key)
        if slot is None:
            self._slots[block.key] = _Slot(block, 1)
            self._used += block.nbytes
            self._peak = max(self._peak, self._used)
        else:
            slot.refs += 1

    def _unref(self, key: int) -> None:
        slot = self._slots[key]
        slot.refs -= 1
        if slot.refs == 0:
            del self._slots[key]
            self._used -= slot.block.nbytes

    def _new_id(self) -> str:
        while True:
            candidate = f"s{next(self._ids)}"
            if candidate not in self._states:
                return candidate

    def __repr__(self) -> str:
        s = self.stats()
        return f"BlockStore(used={s.used_bytes}/{s.capacity_bytes}B, blocks={s.num_blocks}, states={s.num_states})"
