from __future__ import annotations

import pytest
import torch

from graphflow.kv.differential.base import base_kv, template_kv
from graphflow.kv.differential.codecs import apply_residual
from graphflow.kv.differential.recompute import recompute_tokens
from graphflow.kv.packing import stack_cache
from graphflow.models import prompt_token_ids


def _case(e):
    prefix, tmpl = prompt_token_ids(e.tokenizer, 40), e.tokenizer.encode("\n### Step: review\nCheck it, then answer.\n")
    out = e.prefill(prefix)
    prefix_kv = stack_cache(out.cache, 0, len(prefix)).clone()
    return prefix, tmpl, prefix_kv, template_kv(e, tmpl, prefix), base_kv(e, tmpl)


def test_recomputing_every_position_is_a_prefill(tiny_qwen_engine):
    e = tiny_qwen_engine
    prefix, tmpl, prefix_kv, exact, base = _case(e)
    approx = apply_residual(base, None, len(prefix), e.identity.rope)
    got = recompute_tokens(e, prefix_kv, approx, tmpl, range(len(tmpl)))
    assert torch.allclose(got, exact, atol=1e-4)


def test_recomputing_some_positions_changes_only_those_and_moves_them_toward_exact(tiny_qwen_engine):
    e = tiny_qwen_engine
    prefix, tmpl, prefix_kv, exact, base = _case(e)
    approx = apply_residual(base, None, len(prefix), e.identity.rope)
    chosen = [0, 3, 5]
    got = recompute_tokens(e, prefix_kv, approx, tmpl, chosen)
    rest = [i for i in range(len(tmpl)) if i not in chosen]
    assert torch.equal(got[:, :, :, rest], approx[:, :, :, rest])
    # the first position sees only the exact prefix, so its recomputed KV is exact
    assert torch.allclose(got[:, :, :, 0], exact[:, :, :, 0], atol=1e-4)
    err = lambda x: (x[:, :, :, chosen] - exact[:, :, :, chosen]).norm()  # noqa: E731
    assert err(got) < err(approx)
    assert torch.equal(recompute_tokens(e, prefix_kv, approx, tmpl, []), approx)


def test_recompute_checks_its_arguments(tiny_qwen_engine):
    e = tiny_qwen_engine
    _, tmpl, prefix_kv, exact, _ = _case(e)
    with pytest.raises(ValueError, match="positions"):
        recompute_tokens(e, prefix_kv, exact, tmpl, [len(tmpl)])
    with pytest.raises(ValueError, match="holds"):
        recompute_tokens(e, prefix_kv, exact[:, :, :, 1:], tmpl, [0])
