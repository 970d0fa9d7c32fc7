from __future__ import annotations

import math

import torch

from graphflow.kv.differential.codecs import ResidualCodec
from graphflow.kv.differential.methods.ours import Ours
from graphflow.kv.differential.paths import PathKey

from .conftest import KEY, make_case


def test_a_learned_dense_residual_rebuilds_its_own_execution(tiny_qwen_engine):
    c = make_case(tiny_qwen_engine)
    ours = Ours(c.store)
    assert ours.rebuild(c.engine, KEY, c.prefix_kv, c.template) is None  # nothing learned: prefill it
    c.store.observe(KEY, c.exact, len(c.prefix))
    got = ours.rebuild(c.engine, KEY, c.prefix_kv, c.template)
    assert got is not None and got.recomputed == 0
    assert torch.allclose(got.kv, c.exact, atol=2e-2)  # float16 residual
    assert ours.rebuild(c.engine, PathKey((), KEY.op), c.prefix_kv, c.template) is None  # a cold path


def test_a_recomputed_head_is_counted_and_exact(tiny_qwen_engine):
    c = make_case(tiny_qwen_engine, ResidualCodec(recompute_fraction=0.15))
    c.store.observe(KEY, c.exact, len(c.prefix))
    got = Ours(c.store).rebuild(c.engine, KEY, c.prefix_kv, c.template)
    head = math.floor(0.15 * len(c.template))
    assert got is not None and got.recomputed == head
    assert torch.allclose(got.kv[:, :, :, :head], c.exact[:, :, :, :head], atol=1e-4)
    assert Ours(c.store).label == "ours (dense, first 15% recomputed)"
