from __future__ import annotations

import pytest
import torch

from graphflow.models import Engine, clone_cache, prompt_token_ids


def test_random_models_are_deterministic(tiny_engine):
    again = Engine.load("tiny-llama")
    assert again.identity == tiny_engine.identity
    for a, b in zip(again.model.parameters(), tiny_engine.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_identity_differs_between_models(tiny_engine, tiny_qwen_engine):
    assert tiny_engine.identity.config_hash != tiny_qwen_engine.identity.config_hash
    assert tiny_engine.identity.rope.theta == 10000.0
    assert tiny_qwen_engine.identity.rope.theta == 1000000.0
    assert tiny_engine.identity.layout.block_shape(16) == (2, 2, 2, 16, 16)


def test_prefill_in_two_parts_matches_one_part(tiny_engine):
    ids = prompt_token_ids(tiny_engine.tokenizer, 64)
    whole = tiny_engine.prefill(ids)
    first = tiny_engine.prefill(ids[:40])
    second = tiny_engine.prefill(ids[40:], first.cache)
    assert second.cache.get_seq_length() == 64
    assert torch.allclose(whole.logits, second.logits, atol=1e-5)
    assert int(whole.logits.argmax()) == int(second.logits.argmax())


def test_decode_from_a_cloned_cache_is_identical_and_leaves_the_original(tiny_engine):
    ids = prompt_token_ids(tiny_engine.tokenizer, 48)
    pre = tiny_engine.prefill(ids)
    first = int(pre.logits.argmax())
    a = tiny_engine.decode_greedy(clone_cache(pre.cache), first, 8)
    b = tiny_engine.decode_greedy(clone_cache(pre.cache), first, 8)
    assert pre.cache.get_seq_length() == 48
    assert a.token_ids == b.token_ids and torch.equal(a.logits, b.logits)
    assert a.logits.shape == (8, tiny_engine.tokenizer.vocab_size)
    full = tiny_engine.full_logits(ids + [first] + list(a.token_ids[:-1]))
    assert tuple(full[48:].argmax(-1).tolist()) == a.token_ids


def test_kv_bytes_per_token_matches_real_cache(tiny_engine):
    pre = tiny_engine.prefill(prompt_token_ids(tiny_engine.tokenizer, 10))
    real = sum(layer.keys.nbytes + layer.values.nbytes for layer in pre.cache.layers) / 10
    assert tiny_engine.kv_bytes_per_token() == real == 2 * 2 * 2 * 16 * 4


def test_bad_arguments(tiny_engine):
    with pytest.raises(ValueError, match="at least one token"):
        tiny_engine.prefill([])
    with pytest.raises(ValueError, match="steps"):
        tiny_engine.decode_greedy(tiny_engine.new_cache(), 1, 0)
    with pytest.raises(ValueError, match="unknown dtype"):
        Engine.load("tiny-llama", dtype="int3")


def test_prompt_token_ids_exact_length(tiny_engine):
    ids = prompt_token_ids(tiny_engine.tokenizer, 1000)
    assert len(ids) == 1000
    assert tiny_engine.tokenizer.decode(ids[:9]) == "Section 1"


def test_batched_rows_decode_like_each_row_alone(tiny_engine):
    from graphflow.kv.packing import batch_cache, stack_cache

    prompts = [prompt_token_ids(tiny_engine.tokenizer, 40), list(range(3, 43))]
    alone = []
    for ids in prompts:
        pre = tiny_engine.prefill(ids[:-4])
        first = tiny_engine.prefill(ids[-4:], pre.cache)
        out = tiny_engine.decode_greedy(first.cache, int(first.logits.argmax()), 5)
        alone.append([int(first.logits.argmax()), *out.token_ids])
    caches = [stack_cache(tiny_engine.prefill(ids[:-4]).cache) for ids in prompts]
    cache = batch_cache(caches, tiny_engine.config)
    firsts = tiny_engine.forward_rows([ids[-4:] for ids in prompts], cache)
    rest = tiny_engine.decode_rows(cache, firsts, 5)
    assert [[f, *r] for f, r in zip(firsts, rest, strict=True)] == alone
    assert cache.get_seq_length() == 36 + 4 + 5
    with pytest.raises(ValueError, match="equal length"):
        tiny_engine.forward_rows([[1, 2], [3]], cache)
