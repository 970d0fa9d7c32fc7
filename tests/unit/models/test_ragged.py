from __future__ import annotations

import threading

import pytest
import torch

from graphflow.kv.packing import cache_length, stack_cache
from graphflow.models import prompt_token_ids
from graphflow.models.ragged import GemmPadding, Row, SharedPrefix, attend, forward_rows, merge, unsupported

TOL = 1e-5  # fp32 logits of the tiny models: packing only reorders the multiplies' sums
PAD_9_TO_16 = GemmPadding(tuple(n if n < 9 else 16 for n in range(1, 17)))


@pytest.fixture(params=["llama", "qwen2"])
def engine(request, tiny_engine, tiny_qwen_engine):
    return tiny_engine if request.param == "llama" else tiny_qwen_engine


def test_rows_of_different_lengths_get_what_each_gets_alone(engine):
    prompts = [prompt_token_ids(engine.tokenizer, n) for n in (37, 5, 64)]
    alone = [engine.prefill(p) for p in prompts]
    rows = [Row(p, engine.new_cache()) for p in prompts]
    logits = forward_rows(engine.model, rows)
    for a, got, row in zip(alone, logits, rows, strict=True):
        assert torch.allclose(got, a.logits, atol=TOL)
        assert int(got.argmax()) == int(a.logits.argmax())
        assert torch.allclose(stack_cache(row.cache), stack_cache(a.cache), atol=TOL)


def test_packed_decode_continues_each_row_as_alone(engine):
    prompts = [prompt_token_ids(engine.tokenizer, n) for n in (20, 48)]
    alone = []
    for p in prompts:
        pre = engine.prefill(p)
        first = int(pre.logits.argmax())
        alone.append([first, *engine.decode_greedy(pre.cache, first, 6).token_ids])
    rows = [Row(p, engine.new_cache()) for p in prompts]
    got = [[int(x.argmax())] for x in forward_rows(engine.model, rows)]
    for _ in range(6):
        out = forward_rows(engine.model, [Row([g[-1]], r.cache) for g, r in zip(got, rows, strict=True)])
        for g, x in zip(got, out, strict=True):
            g.append(int(x.argmax()))
    assert got == alone


def test_decode_steps_padded_to_16_rows_give_each_row_what_it_gets_unpadded(engine):
    # 11 rows decoding: the MLP and the head run over 16 rows, 5 of them zeros
    prompts = [prompt_token_ids(engine.tokenizer, n) for n in range(3, 14)]
    out, head_rows = {}, []
    hook = engine.model.lm_head.register_forward_hook(lambda m, args, y: head_rows.append(args[0].shape[-2]))
    try:
        for name, pad in (("padded", PAD_9_TO_16), ("unpadded", GemmPadding())):
            rows = [Row(p, engine.new_cache()) for p in prompts]
            firsts = [int(x.argmax()) for x in forward_rows(engine.model, rows, pad)]
            step = forward_rows(engine.model, [Row([f], r.cache) for f, r in zip(firsts, rows, strict=True)], pad)
            out[name] = (torch.stack(step), [stack_cache(r.cache) for r in rows])
    finally:
        hook.remove()
    assert head_rows == [16, 16, 11, 11]
    (padded, caches), (unpadded, plain) = out["padded"], out["unpadded"]
    assert torch.allclose(padded, unpadded, atol=TOL)
    assert padded.argmax(-1).tolist() == unpadded.argmax(-1).tolist()
    assert all(torch.allclose(a, b, atol=TOL) for a, b in zip(caches, plain, strict=True))


def blocks_of(kv: torch.Tensor, tokens: int) -> list[torch.Tensor]:
    """``kv`` cut along the tokens into separate tensors, as a store holds it."""
    return [part.contiguous() for part in kv.split(tokens, dim=3)]


@pytest.mark.parametrize("held", ["joined", "blocks"])
def test_shared_prefix_equals_attention_over_the_concatenated_cache(engine, held):
    root = prompt_token_ids(engine.tokenizer, 48)
    kv = stack_cache(engine.prefill(root).cache)
    prefix = SharedPrefix.from_tensor(kv) if held == "joined" else SharedPrefix(blocks_of(kv, 16))
    suffixes = [prompt_token_ids(engine.tokenizer, n)[-n:] for n in (9, 1, 17)]
    rows = [Row(s, engine.new_cache(), prefix) for s in suffixes]
    logits = forward_rows(engine.model, rows)
    for s, got, row in zip(suffixes, logits, rows, strict=True):
        full = engine.prefill(root + s)
        assert torch.allclose(got, full.logits, atol=TOL)
        assert cache_length(row.cache) == len(s)  # the row holds its suffix only
        assert torch.allclose(stack_cache(row.cache), stack_cache(full.cache, 48), atol=TOL)
    assert prefix.tokens == 48


def test_a_prefill_chunk_that_does_not_end_returns_no_logits(tiny_engine):
    ids = prompt_token_ids(tiny_engine.tokenizer, 40)
    cache = tiny_engine.new_cache()
    assert forward_rows(tiny_engine.model, [Row(ids[:24], cache, logits=False)]) == [None]
    last = forward_rows(tiny_engine.model, [Row(ids[24:], cache)])[0]
    assert torch.allclose(last, tiny_engine.prefill(ids).logits, atol=TOL)


def test_split_attention_merged_by_log_sum_exp_equals_full_attention():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 6, 5, 8), torch.randn(1, 2, 30, 8), torch.randn(1, 2, 30, 8)
    full, full_lse = attend(q, k, v, 0.35, causal=True)
    head = attend(q, k[:, :, :12], v[:, :, :12], 0.35, causal=False)
    tail = attend(q, k[:, :, 12:], v[:, :, 12:], 0.35, causal=True)
    assert torch.allclose(merge([head, tail]), full, atol=1e-6)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q,
        k.repeat_interleave(3, 1),
        v.repeat_interleave(3, 1),
        scale=0.35,
        attn_mask=torch.ones(5, 30, dtype=torch.bool).tril(25),
    )
    assert torch.allclose(full, ref, atol=1e-6)
    scores = (q @ k.repeat_interleave(3, 1).transpose(2, 3)) * 0.35
    assert torch.allclose(
        full_lse,
        torch.logsumexp(scores.masked_fill(~torch.ones(5, 30, dtype=torch.bool).tril(25), float("-inf")), -1),
        atol=1e-5,
    )


def test_rejects_what_it_cannot_batch(tiny_engine):
    with pytest.raises(ValueError, match="at least one token"):
        forward_rows(tiny_engine.model, [Row([], tiny_engine.new_cache())])
    assert unsupported(tiny_engine.model) == ""


def test_the_shared_prefix_is_read_in_place_not_copied_per_row(tiny_engine):
    root = tiny_engine.prefill(prompt_token_ids(tiny_engine.tokenizer, 64))
    kv = stack_cache(root.cache)
    blocks = blocks_of(kv, 16)
    prefix = SharedPrefix(blocks)
    assert all(p is b for p, b in zip(prefix.parts, blocks, strict=True)) and prefix.nbytes == 0
    rows = [Row([5, 6], tiny_engine.new_cache(), prefix) for _ in range(4)]
    forward_rows(tiny_engine.model, rows)
    assert prefix.tokens == 64 and prefix.nbytes == 0  # it gathers into its thread's buffer, whatever the rows
    assert all(cache_length(r.cache) == 2 for r in rows)
    for layer in range(kv.shape[0]):
        k, v = prefix.layer(layer)
        assert torch.equal(k[0], kv[layer, 0]) and torch.equal(v[0], kv[layer, 1])
        assert k.data_ptr() == prefix.layer(0)[0].data_ptr()  # every layer lands in the same buffer


def test_prefixes_gathered_on_one_thread_share_its_buffer_and_other_threads_have_their_own():
    long, short = torch.randn(2, 2, 1, 64, 8), torch.randn(2, 2, 1, 32, 8)
    a, b = SharedPrefix(list(long.split(16, dim=3))), SharedPrefix(list(short.split(16, dim=3)))
    ka = a.layer(1)[0]
    assert torch.equal(ka[0], long[1, 0])
    kb = b.layer(0)[0]  # the shorter one fits in the longer one's buffer
    assert kb.data_ptr() == ka.data_ptr() and torch.equal(kb[0], short[0, 0])
    elsewhere: list[int] = []
    worker = threading.Thread(target=lambda: elsewhere.append(a.layer(0)[0].data_ptr()))
    worker.start()
    worker.join()
    assert elsewhere[0] != ka.data_ptr()
    assert torch.equal(a.layer(0)[1][0], long[0, 1])  # and this thread's gathers go on as before


def test_a_shared_prefix_refuses_parts_of_different_models():
    with pytest.raises(ValueError, match="one model"):
        SharedPrefix([torch.zeros(2, 2, 1, 16, 8), torch.zeros(3, 2, 1, 16, 8)])
    with pytest.raises(ValueError, match="at least one part"):
        SharedPrefix([])
