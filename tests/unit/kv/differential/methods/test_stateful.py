from __future__ import annotations

import torch

from graphflow.kv.differential.methods.stateful import Stateful

from .conftest import KEY


def test_stateful_is_the_exact_template_kv_with_every_token_recomputed(case):
    got = Stateful().rebuild(case.engine, KEY, case.prefix_kv, case.template)
    assert got is not None and got.recomputed == len(case.template) and got.recompute_fraction == 1
    assert torch.allclose(got.kv, case.exact, atol=1e-5)
