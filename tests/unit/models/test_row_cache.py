"""A request's cache with its room reserved, turned into stored blocks in place."""

from __future__ import annotations

import pytest
import torch

from graphflow.kv.block import ROOT_KEY
from graphflow.kv.packing import cache_length, cache_to_blocks, stack_cache
from graphflow.models import prompt_token_ids
from graphflow.models.ragged import Row, forward_rows


def filled(engine, ids, capacity, chunk=7):
    """A row cache holding ``ids``, run through the ragged forward in chunks (as the loop does)."""
    cache = engine.new_cache(capacity)
    for lo in range(0, len(ids), chunk):
        forward_rows(engine.model, [Row(ids[lo : lo + chunk], cache)])
    return cache


def test_a_row_cache_holds_what_a_growing_cache_holds(tiny_engine):
    ids = prompt_token_ids(tiny_engine.tokenizer, 40)
    cache = filled(tiny_engine, ids, capacity=45)
    assert cache_length(cache) == 40 and cache.capacity == 45
    assert torch.allclose(stack_cache(cache), stack_cache(tiny_engine.prefill(ids).cache), atol=1e-5)


def test_into_blocks_gives_the_blocks_of_the_cache_in_its_own_memory(tiny_engine):
    ids = prompt_token_ids(tiny_engine.tokenizer, 40)  # two full blocks of 16 and one of 8
    cache = filled(tiny_engine, ids, capacity=41)
    expected = cache_to_blocks(cache, ids, tiny_engine.identity, 16)
    room = cache._room
    lo, hi = room.data_ptr(), room.data_ptr() + room.numel() * room.element_size()
    blocks = cache.into_blocks(ids, 0, ROOT_KEY, tiny_engine.identity.model_key, 16)
    assert [b.key for b in blocks] == [b.key for b in expected]
    assert [b.checksum for b in blocks] == [b.checksum for b in expected]
    for got, want in zip(blocks, expected, strict=True):
        assert torch.equal(got.tensor, want.tensor) and got.tensor.is_contiguous()
        assert lo <= got.tensor.data_ptr() < hi  # no copy: the blocks are the cache's buffer
    with pytest.raises(RuntimeError, match="turned into stored blocks"):
        forward_rows(tiny_engine.model, [Row([1], cache)])


def test_a_row_cache_continues_a_chain_and_refuses_what_does_not_fit(tiny_engine):
    ids = prompt_token_ids(tiny_engine.tokenizer, 20)
    cache = filled(tiny_engine, ids[16:], capacity=4)
    with pytest.raises(ValueError, match="5 tokens but its cache reserved 4"):
        forward_rows(tiny_engine.model, [Row([9], cache)])
    with pytest.raises(ValueError, match="holds 4 tokens but 3"):
        cache.into_blocks(ids[16:19], 16, 123, tiny_engine.identity.model_key, 16)
    (block,) = cache.into_blocks(ids[16:], 16, 123, tiny_engine.identity.model_key, 16)
    assert block.parent_key == 123 and block.position_offset == 16 and block.token_ids == tuple(ids[16:])
    with pytest.raises(ValueError, match="at least one token"):
        tiny_engine.new_cache(0)
