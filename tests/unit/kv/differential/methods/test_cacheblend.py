from __future__ import annotations

import math

import pytest
import torch

from graphflow.kv.differential.methods.cacheblend import CacheBlend, deviating_tokens, early_layer_kv
from graphflow.kv.differential.methods.stateless import Stateless

from .conftest import KEY


def test_ratio_one_is_exact_and_ratio_zero_is_stateless(case):
    e = case.engine
    full = CacheBlend(case.store, 1.0).rebuild(e, KEY, case.prefix_kv, case.template)
    assert full is not None and full.recomputed == len(case.template) and full.recompute_fraction == 1
    assert torch.allclose(full.kv, case.exact, atol=1e-4)
    none = CacheBlend(case.store, 0.0).rebuild(e, KEY, case.prefix_kv, case.template)
    stateless = Stateless(case.store).rebuild(e, KEY, case.prefix_kv, case.template)
    assert none is not None and stateless is not None and none.recomputed == 0
    assert torch.equal(none.kv, stateless.kv)


def test_the_recompute_fraction_is_exact_and_the_selection_deterministic(case):
    e, n = case.engine, len(case.template)
    blend = CacheBlend(case.store, 0.3)
    a = blend.rebuild(e, KEY, case.prefix_kv, case.template)
    b = blend.rebuild(e, KEY, case.prefix_kv, case.template)
    assert a is not None and b is not None
    assert a.recomputed == math.floor(0.3 * n) and torch.equal(a.kv, b.kv)
    stateless = Stateless(case.store).rebuild(e, KEY, case.prefix_kv, case.template)
    assert stateless is not None
    changed = (a.kv != stateless.kv).flatten(end_dim=2).any(0).any(-1)
    assert int(changed.sum()) == a.recomputed  # exactly the chosen tokens were replaced
    err = lambda x: (x - case.exact).norm()  # noqa: E731
    assert err(a.kv) < err(stateless.kv)


def test_the_early_layer_pass_matches_the_full_prefill_and_restores_the_model(case):
    e = case.engine
    layers = len(e.model.model.layers)
    for layer in (0, 1, layers - 1):
        got = early_layer_kv(e, case.prefix_kv, case.template, layer)
        assert torch.allclose(got, case.exact[layer], atol=1e-4)
    assert len(e.model.model.layers) == layers
    with pytest.raises(ValueError, match="check layer"):
        early_layer_kv(e, case.prefix_kv, case.template, layers)


def test_deviating_tokens_rank_by_error_and_break_ties_to_the_earlier_token():
    exact = torch.zeros(2, 1, 5, 2)
    approx = exact.clone()
    approx[0, 0, 3] = 2.0  # the largest error
    approx[1, 0, 1] = 1.0  # tied with token 4
    approx[1, 0, 4] = 1.0
    assert deviating_tokens(exact, approx, 1) == [3]
    assert deviating_tokens(exact, approx, 2) == [1, 3]
    assert deviating_tokens(exact, approx, 3) == [1, 3, 4]


def test_cacheblend_checks_its_ratio(case):
    with pytest.raises(ValueError, match="ratio"):
        CacheBlend(case.store, 1.2)
    assert CacheBlend(case.store, 0.15).label == "cacheblend-15%"
