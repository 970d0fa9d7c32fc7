from __future__ import annotations

import numpy as np
import pytest

from graphflow.kv.catalog import BlockBatch
from graphflow.kv.keys import ROOT_KEY, chain_keys
from graphflow.kv.manager import AdmitEvent, EvictEvent, KVStateManager, ManagerStats, ReplicaInfo, StateRecord
from graphflow.kv.state import KVState, Lineage, Placement, Positions, RopeInfo

MODEL_KEY = "toy@cafe"
BT = 4
NB = 1000  # bytes per full block


def _admit(mgr, replica, state_id, tokens, parents=(), now=0.0, checksum_salt=0, operator="materialize"):
    ev = _event(replica, state_id, tokens, parents, checksum_salt, operator)
    mgr.apply([ev], now)
    mgr.check_integrity()
    return list(ev.record.state.block_keys)


def _event(replica, state_id, tokens, parents=(), checksum_salt=0, operator="materialize"):
    keys = chain_keys(tokens, MODEL_KEY, BT)
    parent_keys = [ROOT_KEY, *keys[:-1]]
    ntok = [min(BT, len(tokens) - i * BT) for i in range(len(keys))]
    batch = BlockBatch(
        replica=replica,
        state=state_id,
        key=np.array(keys, dtype=np.uint64),
        parent_key=np.array(parent_keys, dtype=np.uint64),
        position_offset=np.arange(len(keys), dtype=np.int32) * BT,
        num_tokens=np.array(ntok, dtype=np.int16),
        nbytes=np.array([NB * n // BT for n in ntok], dtype=np.int32),
        checksum=np.array([(k ^ checksum_salt) & 0xFFFFFFFF for k in keys], dtype=np.uint64),
    )
    state = KVState(
        state_id,
        "toy",
        "cafe",
        tuple(keys),
        Positions(0, len(tokens), RopeInfo(1e4)),
        Lineage(operator, tuple(parents)),
        Placement(replica),
    )
    return AdmitEvent(replica, StateRecord.of(state, tokens), batch)


@pytest.fixture
def mgr():
    m = KVStateManager(block_tokens=BT)
    m.add_replica(ReplicaInfo("r0", node="n0", budget_bytes=10 * NB))
    m.add_replica(ReplicaInfo("r1", node="n1", budget_bytes=10 * NB))
    return m


def test_longest_prefix_per_replica(mgr):
    _admit(mgr, "r0", "a", list(range(16)))
    _admit(mgr, "r1", "b", list(range(8)))
    keys = chain_keys(list(range(20)), MODEL_KEY, BT)
    matches = mgr.longest_prefix(keys)
    assert [(m.replica, m.num_blocks, m.num_tokens) for m in matches] == [("r0", 4, 16), ("r1", 2, 8)]
    assert mgr.longest_prefix(chain_keys([99, 98, 97, 96], MODEL_KEY, BT)) == []


def test_locate_and_placement(mgr):
    keys = _admit(mgr, "r0", "a", list(range(8)))
    _admit(mgr, "r1", "a2", list(range(8)))  # same blocks, second copy
    assert sorted(mgr.locate(keys[0])) == ["r0", "r1"]
    place = mgr.placement("a")
    assert sorted(place) == sorted((k, n, r, "cpu") for k in keys for n, r in (("n0", "r0"), ("n1", "r1")))


def test_drop_replica_forgets_its_copies_but_keeps_lineage(mgr):
    keys = _admit(mgr, "r0", "a", list(range(8)))
    _admit(mgr, "r1", "a2", list(range(8)))
    _admit(mgr, "r1", "b", list(range(8, 16)))
    mgr.pin(keys, "r1")
    assert mgr.drop_replica("r1") == 4  # pinned or not, the bytes are gone with the replica
    assert mgr.locate(keys[0]) == ["r0"] and [i.name for i in mgr.list_replicas()] == ["r0"]
    assert mgr.longest_prefix(chain_keys(list(range(8, 16)), MODEL_KEY, BT)) == []
    assert mgr.state("b").token_ids == list(range(8, 16))  # lineage survives: it can be recomputed
    mgr.check_integrity()
    with pytest.raises(ValueError, match="unknown replica"):
        mgr.drop_replica("r1")


def test_begin_node_leases_and_counts_hits(mgr):
    _admit(mgr, "r0", "a", list(range(12)))
    look = mgr.begin_node(list(range(12)) + [50, 51], MODEL_KEY, now_s=5.0, lease_s=10.0)
    assert look.leased_replica == "r0" and look.matches[0].num_blocks == 3
    c = mgr.catalog
    rows = [c.rows_of(k)[0] for k in look.keys[:3]]
    assert c.col("hits")[rows].tolist() == [1, 1, 1]
    assert c.col("lease_until_s")[rows].tolist() == [15.0] * 3


def test_lineage_walks(mgr):
    _admit(mgr, "r0", "root", list(range(8)))
    _admit(mgr, "r0", "child", list(range(12)), parents=("root",), operator="append")
    _admit(mgr, "r0", "grandchild", list(range(16)), parents=("child",), operator="append")
    assert mgr.ancestors("grandchild") == ["child", "root"]
    assert mgr.descendants("root") == ["child", "grandchild"]
    with pytest.raises(ValueError, match="unknown state"):
        mgr.ancestors("nope")


def test_eviction_plan_respects_budget_pins_and_next_use(mgr):
    keys = _admit(mgr, "r0", "a", list(range(48)))  # 12 blocks, budget 10
    assert mgr.used_bytes("r0") == 12 * NB
    mgr.pin(keys[-1:], "r0")
    plan = mgr.plan_eviction("r0", now_s=100.0, next_use={keys[-2]: 1})
    assert plan.freed_bytes == 2 * NB and plan.shortfall_bytes == 0
    assert keys[-1] not in plan.keys and keys[-2] not in plan.keys
    assert plan.keys == (keys[-3], keys[-4])  # deeper blocks first among equals
    mgr.apply([EvictEvent("r0", plan.keys)], 100.0)
    mgr.check_integrity()
    assert mgr.used_bytes("r0") == 10 * NB
    assert mgr.plan_eviction("r0", now_s=100.0).keys == ()


def test_pinned_blocks_are_never_evicted(mgr):
    keys = _admit(mgr, "r0", "a", list(range(48)))
    mgr.pin(keys, "r0")
    plan = mgr.plan_eviction("r0", now_s=1.0)
    assert plan.keys == () and plan.shortfall_bytes == 2 * NB
    with pytest.raises(ValueError, match="pinned"):
        mgr.apply([EvictEvent("r0", (keys[0],))], 1.0)
    mgr.pin(keys, "r0", delta=-1)
    with pytest.raises(ValueError, match="not pinned"):
        mgr.pin(keys, "r0", delta=-1)


def test_recovery_plan_reuse_transfer_recompute(mgr):
    keys = _admit(mgr, "r0", "a", list(range(18)))  # 5 blocks: 4 full + 2 tokens
    _admit(mgr, "r1", "b", list(range(8)))
    mgr.apply([EvictEvent("r0", tuple(keys[:2]) + tuple(keys[3:]))], 1.0)
    # r1 holds blocks 0-1; r0 only block 2; blocks 3-4 are gone
    plan = mgr.recovery_plan("a", "r1")
    assert [(s.action, s.source, s.blocks, s.tokens) for s in plan.steps] == [
        ("reuse", "r1", (0, 2), (0, 8)),
        ("transfer", "r0", (2, 3), (8, 12)),
        ("recompute", "", (3, 5), (12, 18)),
    ]
    assert plan.recompute_tokens == 6


def test_snapshot_restore_answers_identically(mgr, tmp_path):
    keys = _admit(mgr, "r0", "a", list(range(20)))
    _admit(mgr, "r1", "b", list(range(24)), parents=("a",))
    mgr.pin(keys[:1], "r0")
    mgr.apply([EvictEvent("r1", (chain_keys(list(range(24)), MODEL_KEY, BT)[-1],))], 2.0)
    mgr.snapshot(tmp_path)
    back = KVStateManager.restore(tmp_path)
    back.check_integrity()
    probe = chain_keys(list(range(24)), MODEL_KEY, BT)
    assert back.longest_prefix(probe) == mgr.longest_prefix(probe)
    assert back.placement("b") == mgr.placement("b")
    assert back.ancestors("b") == ["a"] and back.descendants("a") == ["b"]
    assert back.plan_eviction("r0", 3.0, budget_bytes=NB) == mgr.plan_eviction("r0", 3.0, budget_bytes=NB)
    assert back.recovery_plan("b", "r0") == mgr.recovery_plan("b", "r0")
    assert back.state("a") == mgr.state("a")


def test_state_records_round_trip_through_their_table(tmp_path):
    """Token ids and block keys are written as list columns built from one buffer each: every
    record reads back equal, an empty one and an empty table included."""
    from dataclasses import replace

    from graphflow.kv.state_table import read_states, write_states

    records = [_event("r0", f"s{n}", list(range(7 * n, 9 * n)), ()).record for n in range(1, 4)]
    records.append(_event("r1", "huge-ids", [2**31 - 1, 0, 123_456_789], ("s1",)).record)
    empty = records[0]
    records.insert(0, replace(empty, state=replace(empty.state, state_id="empty", block_keys=()), token_bytes=b""))
    replicas = [ReplicaInfo("r0", node="n0", budget_bytes=NB)]
    for written in (records, []):
        write_states(tmp_path / "states.parquet", written, replicas, BT)
        back, back_replicas, block_tokens = read_states(tmp_path / "states.parquet")
        assert back == written and back_replicas == replicas and block_tokens == BT
    assert records[0].token_bytes == b"" and records[-1].token_ids == [2**31 - 1, 0, 123_456_789]


def test_an_ended_runs_records_are_kept_a_while_then_forgotten(tmp_path):
    mgr = KVStateManager(block_tokens=BT, retain_ended_s=10.0)
    mgr.add_replica(ReplicaInfo("r0", node="n0", budget_bytes=10 * NB))
    _admit(mgr, "r0", "run-1:ROOT", list(range(8)))
    keys = _admit(mgr, "r0", "run-1:n1", list(range(12)), parents=("run-1:ROOT",))
    _admit(mgr, "r0", "run-2:ROOT", list(range(100, 108)))
    assert mgr.end_run("run-1", 5.0) == 0  # kept for lineage and recovery a while
    assert mgr.ancestors("run-1:n1") == ["run-1:ROOT"] and mgr.recovery_plan("run-1:n1", "r0").recompute_tokens == 0
    assert mgr.end_run("run-2", 14.9) == 0 and "run-1:n1" in mgr.state_ids()
    assert mgr.end_run("run-3", 15.0) == 2  # run-1 ended 10 s ago
    with pytest.raises(ValueError, match="unknown state 'run-1:n1'"):
        mgr.state("run-1:n1")
    assert mgr.longest_prefix(keys)[0].num_blocks == len(keys)  # its blocks are still found and reused
    mgr.check_integrity()
    mgr.snapshot(tmp_path)
    back = KVStateManager.restore(tmp_path)
    assert back.state_ids() == ["run-2:ROOT"]
    with pytest.raises(ValueError, match="retain_ended_s must be 0 or more"):
        KVStateManager(retain_ended_s=-1.0)


def test_a_restored_manager_still_forgets_the_runs_that_had_ended(tmp_path):
    mgr = KVStateManager(block_tokens=BT, retain_ended_s=10.0)
    mgr.add_replica(ReplicaInfo("r0", node="n0", budget_bytes=10 * NB))
    _admit(mgr, "r0", "run-1:ROOT", list(range(8)))
    _admit(mgr, "r0", "run-2:ROOT", list(range(100, 108)))
    assert mgr.end_run("run-1", 5.0) == 0
    mgr.snapshot(tmp_path)  # run-1 ended, its records still kept; run-2 still running
    back = KVStateManager.restore(tmp_path, retain_ended_s=10.0)
    assert back.state_ids() == ["run-1:ROOT", "run-2:ROOT"]
    assert back.end_run("run-3", 15.0) == 1 and back.state_ids() == ["run-2:ROOT"]
    (tmp_path / "runs.json").unlink()  # a snapshot of an older version: no ended runs known
    assert KVStateManager.restore(tmp_path).end_run("run-3", 1e9) == 0


def test_the_summary_counts_records_rows_runs_and_the_last_snapshot(tmp_path):
    mgr = KVStateManager(block_tokens=BT, retain_ended_s=10.0)
    mgr.add_replica(ReplicaInfo("r0", node="n0", budget_bytes=10 * NB))
    gone = _admit(mgr, "r0", "run-1:ROOT", list(range(8)))
    _admit(mgr, "r0", "run-2:ROOT", list(range(100, 112)))
    mgr.apply([EvictEvent("r0", tuple(gone), "run-1:ROOT")], 1.0)
    mgr.begin_run("run-2", "job-2")
    mgr.begin_run("run-3", "job-3")
    assert mgr.summary() == ManagerStats(2, 5, 3, 2, 0, 0, 0.0)
    assert mgr.end_runs_of({"job-3"}, 2.0) == ["run-3"]
    mgr.end_run("run-1", 2.0)
    mgr.snapshot(tmp_path)
    held = mgr.summary()
    assert (held.running_runs, held.ended_runs, held.abandoned_runs) == (1, 2, 1) and held.snapshot_s > 0
    restored = KVStateManager.restore(tmp_path).summary()
    assert (restored.records, restored.running_runs, restored.ended_runs) == (2, 1, 2)


def test_an_idle_manager_forgets_ended_runs_when_asked():
    mgr = KVStateManager(block_tokens=BT, retain_ended_s=10.0)
    mgr.add_replica(ReplicaInfo("r0", node="n0", budget_bytes=10 * NB))
    _admit(mgr, "r0", "run-1:ROOT", list(range(8)))
    assert mgr.end_run("run-1", 5.0) == 0
    assert mgr.forget_ended(14.9) == 0 and mgr.state_ids() == ["run-1:ROOT"]
    assert mgr.forget_ended(15.0) == 1 and mgr.state_ids() == [] and mgr.summary().ended_runs == 0
    mgr.check_integrity()


def test_forgetting_a_run_drops_its_evicted_blocks_from_the_catalog():
    mgr = KVStateManager(block_tokens=BT, retain_ended_s=0.0)
    mgr.add_replica(ReplicaInfo("r0", node="n0", budget_bytes=10 * NB))
    gone = _admit(mgr, "r0", "run-1:ROOT", list(range(8)))
    live = _admit(mgr, "r0", "run-2:ROOT", list(range(100, 112)))
    mgr.apply([EvictEvent("r0", tuple(gone), "run-1:ROOT")], 1.0)
    assert len(mgr.catalog.col("key")) == len(gone) + len(live)  # evicted rows stay while recorded
    assert mgr.end_run("run-1", 2.0) == 1
    assert sorted(mgr.catalog.col("key").tolist()) == sorted(live)
    mgr.check_integrity()
    assert mgr.longest_prefix(live)[0].num_blocks == len(live)


def test_snapshot_of_other_version_is_refused(mgr, tmp_path):
    import pyarrow.parquet as pq

    _admit(mgr, "r0", "a", list(range(8)))
    mgr.snapshot(tmp_path)
    table = pq.read_table(tmp_path / "catalog.parquet")
    meta = dict(table.schema.metadata)
    meta[b"graphflow.catalog_version"] = b"99"
    pq.write_table(table.replace_schema_metadata(meta), tmp_path / "catalog.parquet")
    with pytest.raises(ValueError, match="version 99"):
        KVStateManager.restore(tmp_path)


def test_bad_admits_leave_the_manager_unchanged(mgr):
    _admit(mgr, "r0", "a", list(range(8)))
    before = (len(mgr.catalog), mgr.used_bytes("r0"))
    # a block whose parent was never admitted
    keys = chain_keys(list(range(12)), MODEL_KEY, BT)
    orphan = BlockBatch(
        "r0",
        "o",
        np.array([keys[2]], np.uint64),
        np.array([12345], np.uint64),
        np.array([8], np.int32),
        np.array([4], np.int16),
        np.array([NB], np.int32),
        np.array([1], np.uint64),
    )
    state = KVState("o", "toy", "cafe", (keys[2],), Positions(8, 4, RopeInfo(1e4)), Lineage("x"))
    with pytest.raises(ValueError, match="unknown parents"):
        mgr.apply([AdmitEvent("r0", StateRecord.of(state, []), orphan)], 0.0)
    with pytest.raises(ValueError, match="unknown parent states"):
        _admit(mgr, "r0", "c", list(range(4)), parents=("ghost",))
    with pytest.raises(ValueError, match="already registered with other contents"):
        _admit(mgr, "r0", "a", list(range(4)))
    _admit(mgr, "r0", "a", list(range(8)))  # the same admit delivered twice is a no-op
    assert (len(mgr.catalog), mgr.used_bytes("r0")) == before
    mgr.check_integrity()


def test_other_replica_may_hold_its_own_version_of_a_key(mgr):
    keys = _admit(mgr, "r0", "a", list(range(8)))
    _admit(mgr, "r1", "b", list(range(8)), checksum_salt=0xABCDEF)  # same tokens, other compute path
    assert sorted(mgr.locate(keys[0])) == ["r0", "r1"]


def test_readmit_on_same_replica_is_idempotent(mgr):
    _admit(mgr, "r0", "a", list(range(8)))
    _admit(mgr, "r0", "a-again", list(range(8)))
    assert mgr.used_bytes("r0") == 2 * NB and len(mgr.catalog) == 2


def test_resync_replica_after_restart_from_an_older_snapshot(mgr, tmp_path):
    _admit(mgr, "r0", "a", list(range(8)))
    mgr.snapshot(tmp_path / "snap")
    mgr.snapshot(tmp_path / "snap")  # overwriting swaps the folder whole
    keys_b = _admit(mgr, "r0", "b", list(range(8, 16)), parents=("a",))
    fresh = KVStateManager.restore(tmp_path / "snap")
    assert fresh.locate(keys_b[0]) == []  # the snapshot predates b
    report = [
        _event("r0", "a", list(range(8))),
        _event("r0", "b", list(range(8, 16)), parents=("a",)),
        _event("r0", "c", list(range(16, 24)), parents=("gone",)),
    ]
    assert fresh.resync_replica(ReplicaInfo("r0", budget_bytes=10 * NB), report) == 3
    assert fresh.locate(keys_b[0]) == ["r0"] and fresh.ancestors("b") == ["a"]
    assert fresh.ancestors("c") == []  # a parent the manager never heard of is left out
    assert fresh.locate(chain_keys(list(range(8)), MODEL_KEY, BT)[0]) == ["r0"]
    fresh.check_integrity()
    with pytest.raises(ValueError, match="no manager snapshot"):
        KVStateManager.restore(tmp_path / "nothing-here")


def test_a_replica_reporting_new_bytes_for_a_key_supersedes_its_old_copy(mgr):
    keys = _admit(mgr, "r0", "a", list(range(8)))
    _admit(mgr, "r1", "b", list(range(8)), checksum_salt=0x1234)  # another replica's own version
    _admit(mgr, "r0", "a2", list(range(8)), checksum_salt=0xABCDEF)  # r0 recomputed a dropped block
    sums = mgr.catalog.col("checksum")
    live = {
        mgr.catalog.replica_name(int(mgr.catalog.col("replica")[r])): int(sums[r]) for r in mgr.catalog.rows_of(keys[0])
    }
    assert live == {"r0": (keys[0] ^ 0xABCDEF) & 0xFFFFFFFF, "r1": (keys[0] ^ 0x1234) & 0xFFFFFFFF}
    mgr.check_integrity()


def test_a_leased_block_is_never_evicted_until_its_lease_ends(mgr):
    keys = _admit(mgr, "r0", "a", list(range(48)), now=1000.0)  # 12 blocks, budget 10
    look = mgr.begin_node(list(range(48)) + [7], MODEL_KEY, now_s=1001.0, lease_s=60.0)
    assert look.leased_replica == "r0"
    during = mgr.plan_eviction("r0", now_s=1030.0)
    assert during.keys == () and during.shortfall_bytes == 2 * NB  # all 12 leased
    after = mgr.plan_eviction("r0", now_s=1062.0)
    assert len(after.keys) == 2 and set(after.keys) <= set(keys)


def test_template_holdings_are_reported_and_looked_up(mgr):
    from graphflow.kv.events import TemplateEvent, TemplateHolding

    res = TemplateHolding("REVIEW", ("SOLVE",), "v1", 20, 4096, 12)
    base = TemplateHolding("REVIEW", None, "v1", 20, 9000)
    mgr.apply([TemplateEvent("r0", (res,)), TemplateEvent("r1", (base,))], 0.0)
    assert dict(mgr.templates_for("REVIEW", ("SOLVE",), "v1")) == {"r0": res, "r1": base}
    assert dict(mgr.templates_for("REVIEW", ("PLAN",), "v1")) == {"r1": base}  # a base serves any path
    assert mgr.templates_for("REVIEW", ("SOLVE",), "v2") == ()  # another template version
    look = mgr.begin_node(list(range(8)), MODEL_KEY, 0.0, 30.0, None, ("REVIEW", ("SOLVE",), "v1"))
    assert dict(look.templates) == {"r0": res, "r1": base}
    mgr.drop_replica("r0")
    assert dict(mgr.templates_for("REVIEW", ("SOLVE",), "v1")) == {"r1": base}


def test_changes_of_one_replica_applied_out_of_order_leave_its_copies_as_they_are():
    """Results reach the manager in the order clients collect them: an eviction applied before
    the older admit it follows must not leave the block listed, nor an older eviction applied
    after a newer admit hide a block the replica holds (``graphflow.kv.copy_order``)."""
    from dataclasses import replace

    m = KVStateManager(block_tokens=BT)
    m.add_replica(ReplicaInfo("r0", node="n0", budget_bytes=10 * NB))
    a = replace(_event("r0", "a", list(range(8))), stamp=10)
    keys = list(a.record.state.block_keys)
    m.apply([EvictEvent("r0", tuple(keys), "a", stamp=11)], 0.0)  # the eviction comes first
    m.apply([a], 0.0)
    assert m.locate(keys[0]) == [] and m.state_ids() == ["a"]  # recorded, but gone from r0
    b = replace(_event("r0", "b", list(range(8))), stamp=20)  # stored again, then ...
    m.apply([b], 0.0)
    m.apply([EvictEvent("r0", tuple(keys), "a", stamp=15)], 0.0)  # ... an older eviction arrives
    assert m.locate(keys[0]) == ["r0"]
    m.apply([replace(_event("r0", "c", list(range(8))), stamp=18)], 0.0)  # an older admit: nothing to undo
    assert m.locate(keys[1]) == ["r0"]
    m.apply([EvictEvent("r0", tuple(keys), "b", stamp=21)], 0.0)  # newer: applied
    assert m.locate(keys[0]) == []
    m.apply([EvictEvent("r0", (keys[0],), "", stamp=0)], 0.0)  # unstamped: applied as it comes
    m.check_integrity()


def test_an_admit_older_than_a_forgotten_eviction_does_not_list_the_blocks(monkeypatch):
    """Past the blocks whose last change the manager remembers, a stale admit of a block evicted
    since is recorded gone (``graphflow.kv.copy_order``)."""
    from dataclasses import replace
    from functools import partial

    import graphflow.kv.manager as manager_module
    from graphflow.kv.copy_order import CopyOrder

    monkeypatch.setattr(manager_module, "CopyOrder", partial(CopyOrder, keys_remembered=2))
    m = KVStateManager(block_tokens=BT)
    m.add_replica(ReplicaInfo("r0", node="n0", budget_bytes=10 * NB))
    a = replace(_event("r0", "a", list(range(8))), stamp=10)
    keys = list(a.record.state.block_keys)
    m.apply([EvictEvent("r0", tuple(keys), "a", stamp=30)], 0.0)  # evicted at 30, applied first
    m.apply([replace(_event("r0", "x", list(range(100, 108))), stamp=31)], 0.0)  # pushes them out
    m.apply([a], 0.0)  # the admit at 10 arrives last
    assert m.locate(keys[0]) == [] and m.state_ids() == ["x", "a"]
    m.apply([EvictEvent("r0", tuple(keys), "a", stamp=20)], 0.0)  # a stale eviction: applied
    x_keys = list(m.state("x").state.block_keys)
    m.apply([replace(_event("r0", "y", list(range(200, 208))), stamp=40)], 0.0)  # x's keys forgotten
    m.apply([replace(_event("r0", "x2", list(range(100, 108))), stamp=25)], 0.0)  # stale, but listed
    assert m.locate(x_keys[0]) == ["r0"]  # NOTE: already listed there: the stale admit changes nothing
    m.check_integrity()


def test_an_older_report_of_a_replica_s_templates_does_not_replace_a_newer_one(mgr):
    from graphflow.kv.events import TemplateEvent, TemplateHolding

    old = TemplateHolding("REVIEW", None, "v1", 20, 9000)
    new = TemplateHolding("REVIEW", ("SOLVE",), "v1", 20, 4096, 12)
    mgr.apply([TemplateEvent("r0", (new,), stamp=20), TemplateEvent("r0", (old,), stamp=10)], 0.0)
    assert mgr.templates_for("REVIEW", ("SOLVE",), "v1") == (("r0", new),)
    mgr.apply([TemplateEvent("r0", (old,))], 0.0)  # unstamped (a resync): applied as it comes
    assert mgr.templates_for("REVIEW", ("SOLVE",), "v1") == (("r0", old),)
