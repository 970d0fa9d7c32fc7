from __future__ import annotations

import pytest
import torch

from graphflow.kv.errors import ChecksumMismatch, IncompatibleState
from graphflow.kv.keys import chain_keys
from graphflow.kv.packing import blocks_to_cache, cache_to_blocks, stack_cache, validate_chain
from graphflow.models import prompt_token_ids


@pytest.fixture(scope="module")
def prefilled(tiny_engine):
    ids = prompt_token_ids(tiny_engine.tokenizer, 100)
    return ids, tiny_engine.prefill(ids)


def test_pack_unpack_round_trip_is_bit_exact(tiny_engine, prefilled):
    ids, pre = prefilled
    blocks = cache_to_blocks(pre.cache, ids, tiny_engine.identity, 16)
    assert [b.num_tokens for b in blocks] == [16] * 6 + [4]
    assert [b.key for b in blocks] == chain_keys(ids, tiny_engine.identity.model_key, 16)
    rebuilt = blocks_to_cache(blocks, tiny_engine.identity, tiny_engine.config)
    for a, b in zip(pre.cache.layers, rebuilt.layers, strict=True):
        assert torch.equal(a.keys, b.keys)
        assert torch.equal(a.values, b.values)
    assert torch.equal(stack_cache(rebuilt), stack_cache(pre.cache))


def test_pack_from_an_aligned_start_continues_the_chain(tiny_engine, prefilled):
    ids, pre = prefilled
    whole = cache_to_blocks(pre.cache, ids, tiny_engine.identity, 16)
    tail = cache_to_blocks(pre.cache, ids, tiny_engine.identity, 16, start=32, parent_key=whole[1].key)
    assert [b.key for b in tail] == [b.key for b in whole[2:]]
    with pytest.raises(ValueError, match="multiple of block_tokens"):
        cache_to_blocks(pre.cache, ids, tiny_engine.identity, 16, start=10)


def test_corrupt_block_is_never_reused(tiny_engine, prefilled):
    ids, pre = prefilled
    blocks = cache_to_blocks(pre.cache, ids, tiny_engine.identity, 16)
    blocks[3].tensor.view(-1)[0] += 1e-3
    with pytest.raises(ChecksumMismatch):
        blocks_to_cache(blocks, tiny_engine.identity, tiny_engine.config)


def test_blocks_of_another_model_are_incompatible(tiny_engine, tiny_qwen_engine, prefilled):
    ids, pre = prefilled
    blocks = cache_to_blocks(pre.cache, ids, tiny_engine.identity, 16)
    with pytest.raises(IncompatibleState, match="tiny-qwen2"):
        validate_chain(blocks, tiny_qwen_engine.identity)


def test_broken_chain_and_bad_shape_are_value_errors(tiny_engine, prefilled):
    ids, pre = prefilled
    blocks = cache_to_blocks(pre.cache, ids, tiny_engine.identity, 16)
    with pytest.raises(ValueError, match="continue the chain"):
        validate_chain([blocks[0], blocks[2]], tiny_engine.identity)
    with pytest.raises(ValueError, match="no blocks"):
        blocks_to_cache([], tiny_engine.identity, tiny_engine.config)
    assert pre.cache.get_seq_length() == 100
    with pytest.raises(ValueError, match="100 tokens"):
        cache_to_blocks(pre.cache, ids[:50], tiny_engine.identity)


def test_batch_cache_rows_pack_back_to_their_tensors(tiny_engine):
    from graphflow.kv.packing import batch_cache, stack_cache

    a = stack_cache(tiny_engine.prefill(prompt_token_ids(tiny_engine.tokenizer, 20)).cache)
    b = stack_cache(tiny_engine.prefill(list(range(5, 25))).cache)
    cache = batch_cache([a, b, a], tiny_engine.config)
    assert cache.get_seq_length() == 20
    for row, want in enumerate((a, b, a)):
        assert torch.equal(stack_cache(cache, row=row), want)
    assert torch.equal(stack_cache(cache, 4, 9, row=1), b[:, :, :, 4:9])
    with pytest.raises(ValueError, match="needs the row"):
        stack_cache(cache)
    with pytest.raises(ValueError, match="outside the cache's batch"):
        stack_cache(cache, row=3)
    with pytest.raises(ValueError, match="one shape"):
        batch_cache([a, a[:, :, :, :10]], tiny_engine.config)


def test_cutting_from_the_layers_equals_cutting_the_stacked_cache(tiny_engine, prefilled):
    from graphflow.kv.block import make_blocks, make_blocks_from_layers
    from graphflow.kv.packing import layer_views

    ids, pre = prefilled
    key = tiny_engine.identity.model_key
    stacked = make_blocks(7, ids[32:], 32, stack_cache(pre.cache, 32), key, 16)
    layered = make_blocks_from_layers(7, ids[32:], 32, layer_views(pre.cache, 32), key, 16)
    assert [(b.key, b.checksum, b.position_offset) for b in layered] == [
        (b.key, b.checksum, b.position_offset) for b in stacked
    ]
    assert all(torch.equal(a.tensor, b.tensor) for a, b in zip(layered, stacked, strict=True))
    with pytest.raises(ValueError, match="layer keys must be"):
        make_blocks_from_layers(7, ids[:5], 0, layer_views(pre.cache, 32), key, 16)
