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


def test_a_runs_records_are_forgotten_together_keeping_what_other_runs_derive_from():
    #   r1:ROOT ─► r1:a ─► r1:b        r2:x derives from r1:a (another run)
    index = StateIndex(
        [record("r1:ROOT"), record("r1:a", "r1:ROOT"), record("r1:b", "r1:a"), record("r2:x", "r1:a"), record("loose")]
    )
    assert index.forget_run("r1") == 1  # r1:b; r1:a and its ancestor stay, r2:x is derived from r1:a
    assert "r1:b" not in index and index.ancestors("r2:x") == ["r1:a", "r1:ROOT"]
    assert index.descendants("r1:ROOT") == ["r1:a", "r2:x"]
    assert index.forget_run("r2") == 1 and index.descendants("r1:a") == []
    assert index.forget_run("r1") == 2 and [r.state.state_id for r in index] == ["loose"]
    assert index.forget_run("r1") == 0 and index.forget_run("") == 0  # an id without a run is never grouped
