"""A request's cache with its room reserved, turned into stored blocks in place."""

from __future__ import annotations

import pytest
import torch

from graphflow.kv.keys import ROOT_KEY
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


def test_into_blocks_gives_the_blocks_of_the_cache_back_to_back_and_spends_it(tiny_engine):
    ids = prompt_token_ids(tiny_engine.tokenizer, 40)  # two full blocks of 16 and one of 8
    cache = filled(tiny_engine, ids, capacity=44)  # room left over: the blocks hold only the 40
    expected = cache_to_blocks(cache, ids, tiny_engine.identity, 16)
    blocks = cache.into_blocks(ids, 0, ROOT_KEY, tiny_engine.identity.model_key, 16)
    assert [b.key for b in blocks] == [b.key for b in expected]
    assert [b.checksum for b in blocks] == [b.checksum for b in expected]
    at = blocks[0].tensor.data_ptr()
    for got, want in zip(blocks, expected, strict=True):
        assert torch.equal(got.tensor, want.tensor) and got.tensor.is_contiguous()
        assert got.tensor.data_ptr() == at  # one buffer, block after block (sent in place)
        at += got.tensor.numel() * got.tensor.element_size()
    assert cache._room is None  # the room is released, not kept beside the blocks
    with pytest.raises(RuntimeError, match="turned into stored blocks"):
        forward_rows(tiny_engine.model, [Row([1], cache)])
    with pytest.raises(RuntimeError, match="turned into stored blocks"):
        cache.into_blocks(ids, 0, ROOT_KEY, tiny_engine.identity.model_key, 16)


@pytest.mark.parametrize("huge_bytes,group_bytes", [(1 << 30, 0), (0, 1), (0, 5 * 4096), (0, 1 << 30)])
def test_a_room_handed_back_as_it_is_copied_loses_no_token(tiny_engine, monkeypatch, huge_bytes, group_bytes):
    """The room's pages really go back to the OS (read again they are zeros) while the rest is
    still to be copied, layer by layer (KV under ``_HUGE_BLOCKS_BYTES``) or a group of blocks at a
    time (above it): a page handed back too early would zero a block."""
    from graphflow.models import row_cache

    monkeypatch.setattr(row_cache, "_HUGE_BLOCKS_BYTES", huge_bytes)
    monkeypatch.setattr(row_cache, "_GROUP_BYTES", group_bytes)
    ids = prompt_token_ids(tiny_engine.tokenizer, 300)  # each row of the room spans pages
    cache = filled(tiny_engine, ids, capacity=333, chunk=64)
    expected = cache_to_blocks(cache, ids, tiny_engine.identity, 16)
    assert cache._room[0, 0, 0].numel() * cache._room.element_size() > 4 * 4096
    blocks = cache.into_blocks(ids, 0, ROOT_KEY, tiny_engine.identity.model_key, 16)
    assert len(blocks) == len(expected) == 19
    for got, want in zip(blocks, expected, strict=True):
        assert torch.equal(got.tensor, want.tensor)
        assert got.checksum == want.checksum


def test_a_short_room_goes_back_a_layer_at_a_time_not_at_the_end(tiny_engine, monkeypatch):
    """KV under ``_HUGE_BLOCKS_BYTES`` (a short node's) is handed back while it is copied, one
    layer's range after another, so a finishing node never holds its whole KV twice (one group
    of ``_GROUP_BYTES`` would hand nothing back before the end)."""
    from graphflow.models import row_cache

    ranges: list[tuple[int, int]] = []
    monkeypatch.setattr(row_cache, "give_back_pages", lambda start, end: ranges.append((start, end)))
    ids = prompt_token_ids(tiny_engine.tokenizer, 40)
    cache = filled(tiny_engine, ids, capacity=44)
    room, layers = cache._room, cache._room.shape[0]
    layer_bytes = room[0].numel() * room.element_size()
    cache.into_blocks(ids, 0, ROOT_KEY, tiny_engine.identity.model_key, 16)
    assert len(ranges) == layers - 1  # the last layer's pages go with the whole room (give_back)
    for i, (start, end) in enumerate(ranges):
        assert end == room.data_ptr() + (i + 1) * layer_bytes
        assert room.data_ptr() <= start <= room.data_ptr() + i * layer_bytes


def test_hand_back_rows_frees_only_whole_pages_of_copied_tokens(monkeypatch):
    from graphflow.models import row_cache

    freed: list[tuple[int, int]] = []
    monkeypatch.setattr(row_cache, "give_back_pages", lambda start, end: freed.append((start, end)))
    room = torch.empty(2, 2, 1, 100, 32)  # rows of 100 tokens of 128 bytes: 12,800 bytes each
    base, row = room.data_ptr(), 100 * 128
    row_cache._hand_back_rows(room, 40, 70)
    assert len(freed) == 4
    for i, (start, end) in enumerate(freed):
        assert start >= base + i * row and end == base + i * row + 70 * 128
        assert start >= (base + i * row + 40 * 128) // 4096 * 4096  # not before the page cut at token 40


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
