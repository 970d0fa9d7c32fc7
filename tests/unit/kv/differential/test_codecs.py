from __future__ import annotations

import pytest
import torch

from graphflow.kv.differential.base import base_kv, residual, template_kv
from graphflow.kv.differential.codecs import near_zero_fractions, reconstruct, sparsify
from graphflow.models import prompt_token_ids


def test_dense_residual_reconstructs_exactly(tiny_qwen_engine):
    e = tiny_qwen_engine
    prefix, tmpl = prompt_token_ids(e.tokenizer, 40), e.tokenizer.encode("\n### Step: review\nCheck it.\n")
    base, exact = base_kv(e, tmpl), template_kv(e, tmpl, prefix)
    assert base.shape == exact.shape == (2, 2, 2, len(tmpl), 16)
    delta = residual(exact, base, len(prefix), e.identity.rope)
    full = sparsify(delta, keep_fraction=1.0)
    assert torch.allclose(reconstruct(base, full, len(prefix), e.identity.rope), exact, atol=1e-2)
    # re-rotation explains part of K: the rotated residual is smaller than the raw one
    raw = residual(exact, base, len(prefix), None)
    assert delta[:, 0].norm() < raw[:, 0].norm()
    assert torch.equal(delta[:, 1], raw[:, 1])  # values are never rotated


def test_sparsify_counts_real_bytes_and_thresholds():
    d = torch.tensor([[0.0, 0.5, -2.0, 0.01]])
    s = sparsify(d, eps=0.1)
    assert s.indices.tolist() == [1, 2] and s.nbytes == 2 * 4 + 2 * 2
    assert torch.allclose(s.dense(), torch.tensor([[0.0, 0.5, -2.0, 0.0]]))
    top = sparsify(d, keep_fraction=0.25)
    assert top.indices.tolist() == [2]
    with pytest.raises(ValueError, match="exactly one"):
        sparsify(d)


def test_near_zero_fractions_per_layer():
    ref = torch.ones(2, 2, 1, 4, 2)
    delta = torch.zeros(2, 2, 1, 4, 2)
    delta[0, 0, 0, 0, 0] = 5.0
    k, v = near_zero_fractions(delta, ref, 0.1)
    assert k == [7 / 8, 1.0] and v == [1.0, 1.0]
