"""Failures during a workflow on the in-process deployment: lost replicas, failed transfers."""

from __future__ import annotations

import time

import pytest

from graphflow.runtime.executor import WorkflowExecutor
from graphflow.runtime.local import LocalCluster
from graphflow.workflow.compile import compile_workflow
from graphflow.workflow.corpus import load_corpus, references
from scheduler.cost import LinkSpec, PrefillModel
from scheduler.policy import Policy

TASK = "A tank holds 40 litres and leaks 3 litres an hour. How much is left after 7 hours? " * 8


def _executor(cluster: LocalCluster) -> WorkflowExecutor:
    w0 = cluster.workers["replica-0"]
    pol = Policy(PrefillModel(0.0, 1e-2, 0.0))  # prefill very expensive, link very fast: transfers chosen
    return WorkflowExecutor(cluster, pol, LinkSpec("local", 1e12, 1e-5), w0.kv_bytes_per_token(), w0.model_key(), 4)


@pytest.fixture
def cluster():
    c = LocalCluster("tiny-llama", replicas=2, timeout_s=2.0)
    yield c
    c.close()


def _reference(cluster: LocalCluster, gs, ids):
    return _executor(cluster).run(gs, ids, "reference", reuse=False).outputs


@pytest.mark.parametrize("fault", ["drop-send", "corrupt-send"])
def test_a_failed_transfer_falls_back_to_recompute(cluster, fault):
    gs = compile_workflow(references(load_corpus())["GSM8K"])
    ids = cluster.workers["replica-0"].encode(TASK)
    for w in cluster.workers.values():
        w.inject_fault(fault)
    result = _executor(cluster).run(gs, ids, f"t-{fault}")
    failed = [t for t in result.trace if t.note]
    assert failed, "a transfer was expected to be chosen and to fail"
    why = "TransferTimeout" if fault == "drop-send" else "ChecksumMismatch"
    assert all(why in t.note and t.decision == "recompute" for t in failed)
    assert result.outputs == _reference(cluster, gs, ids)
    cluster.manager("check_integrity")


def test_a_sender_that_lost_its_blocks_calls_the_receive_off_before_its_deadline():
    slow = LocalCluster("tiny-llama", replicas=2, timeout_s=60.0)  # a receive left waiting would show
    try:
        gs = compile_workflow(references(load_corpus())["GSM8K"])
        ids = slow.workers["replica-0"].encode(TASK)
        for w in slow.workers.values():
            w.inject_fault("lose-send")
        begin = time.perf_counter()
        result = _executor(slow).run(gs, ids, "t-lose-send")
        assert time.perf_counter() - begin < 30.0
        failed = [t for t in result.trace if t.note]
        assert failed, "a transfer was expected to be chosen and its sender to fail"
        assert all("TransferAborted" in t.note and t.decision == "recompute" for t in failed)
        assert result.outputs == _reference(slow, gs, ids)
        slow.manager("check_integrity")
    finally:
        slow.close()


def test_a_replica_lost_mid_workflow_does_not_lose_the_workflow(cluster):
    gs = compile_workflow(references(load_corpus())["GSM8K"])
    ids = cluster.workers["replica-0"].encode(TASK)
    reference = _reference(cluster, gs, ids)
    done: list[str] = []

    def kill_after_first(trace) -> None:
        done.append(trace.node)
        if len(done) == 1:
            cluster.stop_replica("replica-1")

    result = _executor(cluster).run(gs, ids, "t-kill", on_node=kill_after_first)
    assert result.outputs == reference  # exact mode: identical to an undisturbed run
    assert cluster.replicas == ["replica-0"]
    # a node already running in replica-1's thread may still finish there; every later one runs on replica-0
    assert result.trace[-1].replica == "replica-0"
    assert "replica-1" not in {r.name for r in cluster.manager("list_replicas")}
    cluster.manager("check_integrity")


def test_unknown_fault_is_refused(cluster):
    with pytest.raises(ValueError, match="unknown fault"):
        cluster.workers["replica-0"].inject_fault("meteor")


def test_memory_pressure_evicts_and_keeps_outputs_correct():
    gs = compile_workflow(references(load_corpus())["GSM8K"])
    roomy = LocalCluster("tiny-llama", replicas=2, timeout_s=2.0)
    try:
        ids = roomy.workers["replica-0"].encode(TASK)
        reference = _reference(roomy, gs, ids)
        _executor(roomy).run(gs, ids, "ws")
        working_set = max(s.peak_bytes for s in roomy.stats())
    finally:
        roomy.close()
    tight = LocalCluster("tiny-llama", replicas=2, capacity_bytes=working_set // 2, timeout_s=2.0)
    try:
        result = _executor(tight).run(gs, ids, "tight")
        assert result.outputs == reference
        for s in tight.stats():
            assert s.peak_bytes <= s.capacity_bytes == working_set // 2
        for w in tight.workers.values():
            w.store.check_integrity()
        kept = sum(w.store.stats().num_states for w in tight.workers.values())
        assert kept < 1 + len(gs.nodes)  # the root and every node's state were made; some were evicted
        tight.manager("check_integrity")
        held = {r: tight.manager("used_bytes", r) for r in tight.replicas}
        assert all(held[s.replica] == s.used_bytes for s in tight.stats())  # the manager lists what each holds
    finally:
        tight.close()


def test_manager_restart_restores_the_snapshot_and_resyncs_replicas(tmp_path):
    gs = compile_workflow(references(load_corpus())["GSM8K"])
    c = LocalCluster("tiny-llama", replicas=2, timeout_s=2.0, snapshot_dir=str(tmp_path / "snap"))
    try:
        ids = c.workers["replica-0"].encode(TASK)
        reference = _reference(c, gs, ids)
        first = _executor(c).run(gs, ids, "before")
        held = sum(len(w.holdings()) for w in c.workers.values())
        assert (tmp_path / "snap" / "catalog.parquet").is_file()
        assert c.restart_manager() == held
        c.manager("check_integrity")
        after = _executor(c).run(gs, ids, "after")  # serving continues, and the restored catalog is used
        assert after.outputs == first.outputs == reference
        assert after.prefill_tokens_saved > 0
        assert {r.name for r in c.manager("list_replicas")} == {"replica-0", "replica-1"}
    finally:
        c.close()


def test_corrupt_stored_blocks_are_never_reused(cluster):
    gs = compile_workflow(references(load_corpus())["GSM8K"])
    ids = cluster.workers["replica-0"].encode(TASK)
    reference = _reference(cluster, gs, ids)
    _executor(cluster).run(gs, ids, "warm")
    for w in cluster.workers.values():
        w.inject_fault("corrupt-store")
    again = _executor(cluster).run(gs, ids, "after-corruption")
    assert again.outputs == reference
    for w in cluster.workers.values():  # every block still stored is intact
        for sid in list(w.holdings()):
            for b in w.store.blocks(sid.record.state.state_id):
                b.verify()
    cluster.manager("check_integrity")
