from __future__ import annotations

import pytest
import torch

from graphflow.kv.block import make_block
from graphflow.kv.errors import IncompatibleState
from graphflow.kv.keys import ROOT_KEY
from graphflow.kv.state import KVLayout, Lineage, ModelIdentity, RopeInfo
from graphflow.kv.store import BlockStore

from .helpers import IDENTITY, kv

BLOCK_BYTES = 2 * 2 * 2 * 16 * 4 * 4  # layers * K/V * heads * tokens * head_dim * fp32


def _chain(n_tokens: int, seed: int = 0, identity: ModelIdentity = IDENTITY):
    full = kv(n_tokens, seed)
    blocks, parent = [], ROOT_KEY
    for lo in range(0, n_tokens, 16):
        hi = min(lo + 16, n_tokens)
        b = make_block(parent, range(lo, hi), lo, full[:, :, :, lo:hi], identity.model_key)
        blocks.append(b)
        parent = b.key
    return blocks


def _live_bytes(store: BlockStore) -> int:
    seen = {}
    for sid in list(store._states):
        for b in store.blocks(sid):
            seen[b.key] = b.tensor.numel() * b.tensor.element_size()
    return sum(seen.values())


def test_add_state_accounts_real_bytes():
    store = BlockStore(IDENTITY, capacity_bytes=10 * BLOCK_BYTES)
    state = store.add_state(_chain(40), Lineage("materialize"))
    assert state is not None and state.num_tokens == 40 and len(state.block_keys) == 3
    assert store.used_bytes == 2 * BLOCK_BYTES + BLOCK_BYTES // 2 == _live_bytes(store)
    store.check_integrity()


def test_identical_blocks_are_stored_once():
    store = BlockStore(IDENTITY, capacity_bytes=10 * BLOCK_BYTES)
    store.add_state(_chain(32), Lineage("materialize"))
    store.add_state(_chain(32), Lineage("materialize"))
    assert store.used_bytes == 2 * BLOCK_BYTES
    assert all(store.refcount(k) == 2 for k in store.state("s0").block_keys)
    store.check_integrity()


def test_fork_shares_blocks_and_adds_no_bytes():
    store = BlockStore(IDENTITY, capacity_bytes=10 * BLOCK_BYTES)
    parent = store.add_state(_chain(40), Lineage("materialize"))
    assert parent is not None
    before = store.used_bytes
    children = store.fork(parent.state_id, 3)
    assert store.used_bytes == before
    assert [c.lineage for c in children] == [Lineage("fork", (parent.state_id,))] * 3
    assert all(store.refcount(k) == 4 for k in parent.block_keys)
    store.check_integrity()


def test_append_to_shared_tail_copies_only_that_block():
    store = BlockStore(IDENTITY, capacity_bytes=10 * BLOCK_BYTES)
    parent = store.add_state(_chain(40), Lineage("materialize"))
    assert parent is not None
    (child,) = store.fork(parent.state_id, 1)
    old_tail = parent.block_keys[-1]
    grown = store.append(child.state_id, [900, 901], kv(2, 5))
    assert grown is not None and grown.num_tokens == 42
    # shared full blocks untouched, tail copied for the child, parent's tail intact
    assert grown.block_keys[:2] == parent.block_keys[:2]
    assert grown.block_keys[2] != old_tail
    assert store.refcount(old_tail) == 1 and store.refcount(parent.block_keys[0]) == 2
    assert store.used_bytes == 2 * BLOCK_BYTES + BLOCK_BYTES // 2 + (BLOCK_BYTES * 10) // 16
    new_tail = store.blocks(child.state_id)[-1]
    assert new_tail.token_ids == tuple(range(32, 40)) + (900, 901)
    assert torch.equal(new_tail.tensor[:, :, :, :8], store.blocks(parent.state_id)[-1].tensor)
    store.check_integrity()


def test_append_to_private_tail_frees_the_old_tail():
    store = BlockStore(IDENTITY, capacity_bytes=10 * BLOCK_BYTES)
    s = store.add_state(_chain(40), Lineage("materialize"))
    assert s is not None
    grown = store.append(s.state_id, list(range(100, 112)), kv(12, 3))
    assert grown is not None and grown.num_tokens == 52
    assert [b.num_tokens for b in store.blocks(s.state_id)] == [16, 16, 16, 4]
    assert store.used_bytes == 3 * BLOCK_BYTES + BLOCK_BYTES // 4 == _live_bytes(store)
    store.check_integrity()


def test_capacity_failure_returns_none_and_changes_nothing():
    store = BlockStore(IDENTITY, capacity_bytes=2 * BLOCK_BYTES)
    assert store.add_state(_chain(48), Lineage("materialize")) is None
    assert store.used_bytes == 0 and store.stats().num_states == 0
    s = store.add_state(_chain(32), Lineage("materialize"))
    assert s is not None
    assert store.append(s.state_id, [1], kv(1)) is None
    assert store.state(s.state_id).num_tokens == 32
    store.check_integrity()


def test_release_frees_only_unshared_blocks():
    store = BlockStore(IDENTITY, capacity_bytes=10 * BLOCK_BYTES)
    parent = store.add_state(_chain(32), Lineage("materialize"))
    assert parent is not None
    (child,) = store.fork(parent.state_id, 1)
    assert store.release(parent.state_id) == 0
    assert store.release(child.state_id) == 2 * BLOCK_BYTES
    assert store.used_bytes == 0
    store.check_integrity()
    with pytest.raises(ValueError, match="unknown state"):
        store.release(child.state_id)


def test_foreign_and_conflicting_blocks_are_refused():
    store = BlockStore(IDENTITY, capacity_bytes=10 * BLOCK_BYTES)
    other = ModelIdentity("other", "beef", RopeInfo(10000.0), KVLayout(2, 2, 4, "float32"))
    with pytest.raises(IncompatibleState):
        store.add_state(_chain(16, identity=other), Lineage("materialize"))
    store.add_state(_chain(16, seed=0), Lineage("materialize"), state_id="a")
    with pytest.raises(ValueError, match="already exists"):
        store.add_state(_chain(16, seed=0), Lineage("materialize"), state_id="a")
    # same tokens (same key) but other bytes: refused, store unchanged
    with pytest.raises(ValueError, match="refusing to mix"):
        store.add_state(_chain(16, seed=9), Lineage("materialize"))
    assert store.stats().num_states == 1
    store.check_integrity()


def test_check_integrity_detects_corrupted_accounting():
    store = BlockStore(IDENTITY, capacity_bytes=10 * BLOCK_BYTES)
    store.add_state(_chain(16), Lineage("materialize"))
    store._used += 1
    with pytest.raises(RuntimeError, match="accounted"):
        store.check_integrity()
