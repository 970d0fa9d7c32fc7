from __future__ import annotations

import pytest
import torch

from graphflow.kv.packing import stack_cache
from graphflow.kv.rope import rerotate_keys
from graphflow.kv.state import RopeInfo
from graphflow.models import prompt_token_ids


@torch.inference_mode()
def _keys_at(engine, ids, offset):
    pos = torch.arange(offset, offset + len(ids)).unsqueeze(0)
    out = engine.model(input_ids=torch.tensor([ids]), position_ids=pos, cache=engine.new_cache(), use_cache=True)
    return stack_cache(out.cache)


@pytest.mark.parametrize("offset", [1, 37, 1000])
def test_rerotation_matches_direct_computation(tiny_qwen_engine, offset):
    engine = tiny_qwen_engine
    ids = prompt_token_ids(engine.tokenizer, 24)
    base, direct = _keys_at(engine, ids, 0), _keys_at(engine, ids, offset)
    moved = rerotate_keys(base[:, 0], offset, engine.identity.rope)
    assert torch.allclose(moved, direct[:, 0], atol=1e-5)
    assert not torch.allclose(base[:, 0], direct[:, 0], atol=1e-3)  # the test can fail
    assert torch.allclose(base[:, 1], direct[:, 1], atol=1e-5)  # values carry no position


def test_rerotate_round_trip_and_zero():
    k = torch.randn(2, 3, 5, 8)
    rope = RopeInfo(10000.0)
    assert torch.allclose(rerotate_keys(rerotate_keys(k, 50, rope), -50, rope), k, atol=1e-6)
    assert torch.equal(rerotate_keys(k, 0, rope), k)


def test_scaled_rope_is_refused():
    with pytest.raises(ValueError, match="default RoPE only"):
        rerotate_keys(torch.zeros(1, 4), 3, RopeInfo(1e4, '{"rope_type": "yarn"}'))
