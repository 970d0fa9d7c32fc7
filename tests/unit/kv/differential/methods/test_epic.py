from __future__ import annotations

import pytest
import torch

from graphflow.kv.differential.methods.epic import Epic
from graphflow.kv.differential.methods.stateless import Stateless

from .conftest import KEY


def test_k_zero_is_stateless_and_k_all_is_exact(case):
    e, n = case.engine, len(case.template)
    zero = Epic(case.store, tokens=0).rebuild(e, KEY, case.prefix_kv, case.template)
    stateless = Stateless(case.store).rebuild(e, KEY, case.prefix_kv, case.template)
    assert zero is not None and stateless is not None and zero.recomputed == 0
    assert torch.equal(zero.kv, stateless.kv)
    full = Epic(case.store, tokens=n + 5).rebuild(e, KEY, case.prefix_kv, case.template)
    assert full is not None and full.recomputed == n
    assert torch.allclose(full.kv, case.exact, atol=1e-4)


def test_epic_recomputes_exactly_the_first_k_tokens(case):
    e = case.engine
    got = Epic(case.store, tokens=3).rebuild(e, KEY, case.prefix_kv, case.template)
    stateless = Stateless(case.store).rebuild(e, KEY, case.prefix_kv, case.template)
    assert got is not None and stateless is not None and got.recomputed == 3
    assert torch.equal(got.kv[:, :, :, 3:], stateless.kv[:, :, :, 3:])
    # the first k tokens see only the exact prefix and each other: exact
    assert torch.allclose(got.kv[:, :, :, :3], case.exact[:, :, :, :3], atol=1e-4)


def test_a_fraction_rounds_down_and_labels_say_which(case):
    n = len(case.template)
    epic = Epic(case.store, fraction=0.15)
    assert epic.head(n) == 15 * n // 100 and epic.head(20) == 3 and epic.head(19) == 2
    assert epic.label == "epic-15%" and Epic(case.store, tokens=32).label == "epic-32"


def test_epic_checks_its_settings(case):
    with pytest.raises(ValueError, match="exactly one"):
        Epic(case.store)
    with pytest.raises(ValueError, match="non-negative"):
        Epic(case.store, tokens=-1)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Epic(case.store, fraction=1.5)
