from __future__ import annotations

import torch

from graphflow.kv.differential.codecs import apply_residual
from graphflow.kv.differential.methods.stateless import Stateless
from graphflow.kv.differential.paths import PathKey

from .conftest import KEY


def test_stateless_is_the_rerotated_base_with_nothing_recomputed(case):
    got = Stateless(case.store).rebuild(case.engine, KEY, case.prefix_kv, case.template)
    assert got is not None and got.recomputed == 0 and got.recompute_fraction == 0
    want = apply_residual(case.store.bases[KEY.op].kv, None, len(case.prefix), case.store.rope)
    assert torch.equal(got.kv, want)
    assert not torch.allclose(got.kv, case.exact, atol=1e-3)  # the prefix changes the exact KV


def test_stateless_has_nothing_for_an_operation_without_a_base(case):
    assert Stateless(case.store).rebuild(case.engine, PathKey((), "PATCH"), case.prefix_kv, case.template) is None
