"""Stored prefixes held once for every node that continues them."""

from __future__ import annotations

import torch

from graphflow.kv.packing import cache_to_blocks, stack_cache
from graphflow.models import prompt_token_ids
from graphflow.runtime.prefixes import SharedPrefixes


def test_a_prefix_reads_the_blocks_in_place_and_is_built_once_for_all_its_readers(tiny_engine):
    ids = prompt_token_ids(tiny_engine.tokenizer, 64)
    cache = tiny_engine.prefill(ids).cache
    blocks = cache_to_blocks(cache, ids, tiny_engine.identity, 16)
    held = SharedPrefixes(tiny_engine)
    first = held.acquire(blocks)
    full = stack_cache(cache)  # [layers, 2, kv_heads, tokens, head_dim]
    assert all(p is b.tensor for p, b in zip(first.parts, blocks, strict=True))  # no copy of the chain
    for layer in range(full.shape[0]):
        k, v = first.layer(layer)
        assert torch.equal(k[0], full[layer, 0]) and torch.equal(v[0], full[layer, 1])
    assert held.acquire(blocks) is first and held.built == 1
    held.release(blocks)
    held.release(blocks)
    assert held.acquire(blocks) is not first and held.built == 2  # the last reader freed it
