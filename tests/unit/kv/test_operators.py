from __future__ import annotations

import pytest
import torch

from graphflow.checks.fork import run_fork_check
from graphflow.checks.lineage import run_lineage_check
from graphflow.kv.keys import chain_keys
from graphflow.kv.manager import KVStateManager, ReplicaInfo
from graphflow.kv.operators import evict, fork, materialize, merge, transfer
from graphflow.kv.packing import blocks_to_cache, stack_cache
from graphflow.kv.state import Placement
from graphflow.kv.store import BlockStore
from graphflow.models import clone_cache, prompt_token_ids
from transport.base import TransportConfig
from transport.local import LocalTransport


@pytest.fixture
def setup(tiny_engine):
    store = BlockStore(tiny_engine.identity, capacity_bytes=1 << 24, placement=Placement("r0"))
    mgr = KVStateManager(block_tokens=16)
    mgr.add_replica(ReplicaInfo("r0"))
    mgr.add_replica(ReplicaInfo("r1"))
    return tiny_engine, store, mgr


def test_materialize_registers_the_hash_chain(setup):
    engine, store, mgr = setup
    ids = prompt_token_ids(engine.tokenizer, 40)
    state = materialize(engine, store, ids, state_id="a", manager=mgr)
    assert state is not None
    assert list(state.block_keys) == chain_keys(ids, engine.identity.model_key, 16)
    assert mgr.longest_prefix(state.block_keys)[0].num_tokens == 40
    assert mgr.state("a").token_ids == ids
    mgr.check_integrity()
    store.check_integrity()


def test_materialize_that_does_not_fit_returns_none(tiny_engine):
    small = BlockStore(tiny_engine.identity, capacity_bytes=1000)
    assert materialize(tiny_engine, small, prompt_token_ids(tiny_engine.tokenizer, 40)) is None
    assert small.used_bytes == 0


def test_transfer_moves_only_missing_blocks_bit_exact(setup):
    engine, store, mgr = setup
    ids = prompt_token_ids(engine.tokenizer, 64)
    materialize(engine, store, ids, state_id="a", manager=mgr)
    dst = BlockStore(engine.identity, capacity_bytes=1 << 24, placement=Placement("r1"))
    materialize(engine, dst, ids[:32], state_id="pre", manager=mgr)  # dst already has 2 blocks
    a, b = LocalTransport(TransportConfig(timeout_s=5)), LocalTransport(TransportConfig(timeout_s=5))
    try:
        moved, stats = transfer("a", store, dst, a, b, token_ids=ids, manager=mgr)
    finally:
        a.close()
        b.close()
    assert moved is not None and stats is not None
    assert stats.blocks == 2 and stats.nbytes == 2 * 16 * engine.kv_bytes_per_token()
    for x, y in zip(store.blocks("a"), dst.blocks(moved.state_id), strict=True):
        assert torch.equal(x.tensor, y.tensor)
    assert sorted(mgr.locate(moved.block_keys[-1])) == ["r0", "r1"]


def test_fork_adds_no_bytes(setup):
    engine, store, mgr = setup
    ids = prompt_token_ids(engine.tokenizer, 48)
    materialize(engine, store, ids, state_id="a", manager=mgr)
    used = store.used_bytes
    kids = fork(store, "a", 4, manager=mgr, token_ids=ids)
    assert len(kids) == 4 and store.used_bytes == used
    assert mgr.descendants("a") == sorted(k.state_id for k in kids)


def test_exact_merge_when_second_was_computed_after_first(setup):
    engine, store, _ = setup
    ids = prompt_token_ids(engine.tokenizer, 48)
    materialize(engine, store, ids[:32], state_id="first")
    materialize(engine, store, ids, state_id="second")
    used = store.used_bytes
    result = merge(store, "first", "second", ids, skip=32)
    assert result is not None and result.exact and result.rerotated_tokens == 0
    assert store.used_bytes == used and result.state.block_keys == store.state("second").block_keys


def test_approximate_merge_rerotates_the_segment(setup):
    engine, store, _ = setup
    a_ids = prompt_token_ids(engine.tokenizer, 40)
    b_ids = engine.tokenizer.encode("Reviewer: the plan looks fine.")
    materialize(engine, store, a_ids, state_id="a")
    materialize(engine, store, b_ids, state_id="b")
    result = merge(store, "a", "b", b_ids, skip=0)
    assert result is not None and not result.exact and result.rerotated_tokens == len(b_ids)
    assert result.state.num_tokens == 40 + len(b_ids)
    merged = torch.cat([blk.tensor for blk in store.blocks(result.state.state_id)], dim=3)
    # the merged segment's keys equal b's keys computed directly at positions 40.. (no prefix)
    pos = torch.arange(40, 40 + len(b_ids)).unsqueeze(0)
    with torch.inference_mode():
        out = engine.model(input_ids=torch.tensor([b_ids]), position_ids=pos, cache=engine.new_cache(), use_cache=True)
    assert torch.allclose(merged[:, :, :, 40:], stack_cache(out.cache), atol=1e-5)
    # and decoding from the merged state works
    cache = blocks_to_cache(store.blocks(result.state.state_id), engine.identity, engine.config)
    assert engine.decode_greedy(clone_cache(cache), 5, 2).logits.shape[0] == 2
    store.check_integrity()


def test_evict_keeps_lineage_and_refuses_pinned(setup):
    engine, store, mgr = setup
    ids = prompt_token_ids(engine.tokenizer, 32)
    state = materialize(engine, store, ids, state_id="a", manager=mgr)
    assert state is not None
    mgr.pin(state.block_keys, "r0")
    with pytest.raises(ValueError, match="pinned"):
        evict(store, "a", manager=mgr)
    assert store.used_bytes > 0
    mgr.pin(state.block_keys, "r0", delta=-1)
    assert evict(store, "a", manager=mgr) == 32 * engine.kv_bytes_per_token()
    assert mgr.locate(state.block_keys[0]) == []
    plan = mgr.recovery_plan("a", "r0")
    assert [s.action for s in plan.steps] == ["recompute"] and plan.recompute_tokens == 32


def test_fork_check_small():
    r = run_fork_check("tiny-llama", tokens=512, branches=4, decode_tokens=8)
    assert r.measured_bytes == r.shared_bytes + r.private_bytes
    assert r.shared_bytes == 512 * 512
    assert r.ratio_measured_to_dense == pytest.approx(r.ideal_ratio)
    assert r.ratio_measured_to_dense < 1 / 4 + 0.1


def test_lineage_check_small():
    r = run_lineage_check("tiny-llama", states=4, tokens=64)
    assert r.evicted == 2 and r.rebuilt == 2 and r.rebuilt_bit_identical
