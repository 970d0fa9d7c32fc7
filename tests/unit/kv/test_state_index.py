from __future__ import annotations

import pytest

from graphflow.kv.events import StateRecord
from graphflow.kv.state import KVState, Lineage, Positions, RopeInfo
from graphflow.kv.state_index import StateIndex


def record(sid: str, *parents: str) -> StateRecord:
    state = KVState(sid, "toy", "cafe", (), Positions(0, 1, RopeInfo(1e4)), Lineage("fork", parents))
    return StateRecord.of(state, [1])


def test_lineage_walks_both_ways_nearest_first():
    #   a ─► b ─► d
    #   └──► c ─┘
    index = StateIndex([record("a"), record("b", "a"), record("c", "a"), record("d", "b", "c")])
    assert len(index) == 4 and "d" in index and "e" not in index
    assert index.ancestors("d") == ["b", "c", "a"]
    assert index.descendants("a") == ["b", "c", "d"]
    assert index.ancestors("a") == [] and index.descendants("d") == []
    assert [r.state.state_id for r in index] == ["a", "b", "c", "d"]


def test_an_unknown_state_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown state 'x'"):
        StateIndex().get("x")
    with pytest.raises(ValueError, match="unknown state 'x'"):
        StateIndex().descendants("x")
