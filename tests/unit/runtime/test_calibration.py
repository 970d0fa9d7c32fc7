from __future__ import annotations

import pytest
import torch

from graphflow.kv.packing import blocks_to_cache
from graphflow.models.gemm_padding import GemmPadding
from graphflow.models.prompts import prompt_token_ids
from graphflow.runtime.calibration import decode_samples, random_kv_blocks, resume_samples


def test_decode_samples_time_steps_padded_as_the_engine_loop_pads_them(tiny_engine):
    head_rows = []
    hook = tiny_engine.model.lm_head.register_forward_hook(lambda m, args, y: head_rows.append(args[0].shape[-2]))
    try:
        plain = decode_samples(tiny_engine, [(2, 32)], block_tokens=16, steps=1)
        plain_rows, head_rows[:] = list(head_rows), []
        padded = decode_samples(tiny_engine, [(2, 32)], block_tokens=16, steps=1, padding=GemmPadding((1, 4)))
    finally:
        hook.remove()
    assert [(r, c) for r, c, _ in plain + padded] == [(2, 32), (2, 32)] and all(s > 0 for *_, s in plain + padded)
    # the prefix is random KV, not a prefill; each decode step (one untimed, one timed) runs 2 rows, or 4 padded
    assert plain_rows == [2, 2] and head_rows == [4, 4]


def test_random_kv_blocks_chain_the_prompt_tokens_in_the_models_layout(tiny_engine):
    blocks = random_kv_blocks(tiny_engine, 40, block_tokens=16)
    layout = tiny_engine.identity.layout
    assert [b.tensor.shape for b in blocks] == [layout.block_shape(t) for t in (16, 16, 8)]
    assert [t for b in blocks for t in b.token_ids] == prompt_token_ids(tiny_engine.tokenizer, 40)
    assert blocks[0].tensor.dtype == next(tiny_engine.model.parameters()).dtype
    assert blocks[0].tensor.device.type == torch.device(tiny_engine.device).type  # where a prefill's would be
    cache = blocks_to_cache(blocks, tiny_engine.identity, tiny_engine.config)  # a valid chain: checksums hold
    assert cache.get_seq_length() == 40
    again = random_kv_blocks(tiny_engine, 40, block_tokens=16)
    assert all(torch.equal(a.tensor, b.tensor) for a, b in zip(blocks, again, strict=True))  # seeded
    assert not torch.equal(blocks[0].tensor, random_kv_blocks(tiny_engine, 40, 16, seed=1)[0].tensor)
    with pytest.raises(ValueError, match="at least one token"):
        random_kv_blocks(tiny_engine, 0)


def test_resume_samples_time_a_rebuild_without_running_the_model(tiny_engine):
    calls = []
    hook = tiny_engine.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        got = resume_samples(tiny_engine, [16, 48], block_tokens=16, repeats=1)
    finally:
        hook.remove()
    per_token = tiny_engine.kv_bytes_per_token()
    assert [b for b, _ in got] == [16 * per_token, 48 * per_token] and all(s > 0 for _, s in got) and not calls
