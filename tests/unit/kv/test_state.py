from __future__ import annotations

from dataclasses import replace

import pytest

from graphflow.kv.errors import IncompatibleState
from graphflow.kv.state import KVState, Lineage, Positions, RopeInfo, compat, require_compat

from .helpers import IDENTITY


def _state(**changes: object) -> KVState:
    s = KVState("s0", "toy", "cafe", (1, 2), Positions(0, 20, RopeInfo(10000.0)), Lineage("materialize"))
    return replace(s, **changes)  # type: ignore[arg-type]


def test_same_model_config_and_rope_is_compatible():
    assert compat(_state(), IDENTITY).ok
    assert compat(_state(), _state(state_id="other")).ok


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"model_id": "other"}, "from model 'other'"),
        ({"config_hash": "beef"}, "config hash beef"),
        ({"position": Positions(0, 20, RopeInfo(500000.0))}, "rotated with"),
        ({"position": Positions(0, 20, RopeInfo(10000.0, '{"rope_type": "linear", "factor": 2}'))}, "rotated with"),
    ],
)
def test_any_mismatch_is_incompatible(changes, fragment):
    result = compat(_state(**changes), IDENTITY)
    assert not result.ok
    assert fragment in result.reason
    with pytest.raises(IncompatibleState, match="recompute"):
        require_compat(_state(**changes), IDENTITY)
