from __future__ import annotations

from graphflow.kv.block import make_block
from graphflow.kv.keys import ROOT_KEY
from graphflow.kv.state import Lineage
from graphflow.kv.store import BlockStore
from graphflow.runtime.receive_pool import ReceivePool
from graphflow.runtime.replica import ReplicaWorker
from graphflow.runtime.replica_config import ReplicaConfig
from transport.layout import MESSAGE_BYTES
from transport.memory import HostArena

from ..kv.helpers import IDENTITY, kv

SPAN = MESSAGE_BYTES
TOKENS_PER_SPAN = SPAN // IDENTITY.layout.bytes_per_token(4)


def _store_one_span(store: BlockStore) -> None:
    n = TOKENS_PER_SPAN
    block = make_block(ROOT_KEY, range(n), 0, kv(n), IDENTITY.model_key)
    assert store.add_state([block], Lineage("node")) is not None


def test_the_pool_yields_to_the_kv_a_replica_computes():
    arena = HostArena(keep_bytes=0)
    store = BlockStore(IDENTITY, capacity_bytes=4 * SPAN, block_tokens=TOKENS_PER_SPAN)
    pool = ReceivePool(arena, 8 * SPAN, store, recycle_bytes=0)
    assert pool.prefaulted_bytes == pool.held_bytes == 4 * SPAN  # no more than the store holds
    with pool.computing(SPAN + SPAN // 2):  # 2.5 spans of room left: two idle spans stay
        assert pool.held_bytes == 2 * SPAN
    _store_one_span(store)  # what was computed is stored
    with pool.computing(SPAN // 2):  # 4 - 1 - 0.5: still room for both
        assert pool.held_bytes == 2 * SPAN
    received = arena.empty_bytes(SPAN)  # a receive lands in one of them
    with pool.computing(2 * SPAN):  # room for one idle span: the other is in use
        assert pool.held_bytes == 2 * SPAN
    del received
    with pool.computing(3 * SPAN):  # no room at all: every idle span goes, and is not recycled
        assert pool.held_bytes == 0 and arena.keep_bytes == 0
    assert pool.prefaulted_bytes == 4 * SPAN and pool.freed_bytes == 4 * SPAN


def test_a_replica_without_a_pool_frees_nothing():
    arena = HostArena(keep_bytes=0)
    store = BlockStore(IDENTITY, capacity_bytes=4 * SPAN)
    pool = ReceivePool(arena, 0, store, recycle_bytes=0)
    with pool.computing(8 * SPAN):
        assert pool.held_bytes == pool.freed_bytes == 0


def test_a_replica_hands_back_pool_spans_for_the_kv_it_computes():
    w = ReplicaWorker(ReplicaConfig("pool-0", "tiny-llama", 2 * SPAN, transport="local", prefault_bytes=2 * SPAN))
    try:
        before = w.stats()
        assert before.prefaulted_bytes == before.pool_bytes == 2 * SPAN
        ids = w.encode("The context an upstream step computed: " + "a b c d e f g h. " * 20)[:64]
        assert w.materialize("ctx", ids).kept
        after = w.stats()
        assert after.used_bytes > 0 and after.pool_bytes == SPAN  # one span's room went to the computed KV
        assert after.prefaulted_bytes == 2 * SPAN
    finally:
        w.close()
