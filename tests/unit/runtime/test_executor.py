from __future__ import annotations

import pytest

from graphflow.client import calibrate_cluster, measure_link
from graphflow.runtime.executor import WorkflowExecutor
from graphflow.runtime.local import LocalCluster
from graphflow.runtime.replica import NodeRun
from graphflow.workflow.compile import compile_workflow
from graphflow.workflow.corpus import load_corpus, references
from scheduler.cost import LinkSpec, PrefillModel
from scheduler.policy import Policy


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster("tiny-llama", replicas=2)
    yield c
    c.close()


def _executor(cluster, link_bw: float, prefill_b: float) -> WorkflowExecutor:
    w0 = cluster.workers["replica-0"]
    pol = Policy(PrefillModel(0.0, prefill_b, 0.0))
    return WorkflowExecutor(cluster, pol, LinkSpec("local", link_bw, 1e-5), w0.kv_bytes_per_token(), w0.model_key(), 6)


TASK = "A train leaves at 9 and travels 60 km per hour. How far has it gone by noon? " * 8


def test_exact_run_matches_no_reuse_and_saves_prefill(cluster):
    ex = _executor(cluster, link_bw=1e3, prefill_b=1e-4)  # transfers hopeless: reuse or recompute
    gs = compile_workflow(references(load_corpus())["GSM8K"])
    ids = cluster.workers["replica-0"].encode(TASK)
    on = ex.run(gs, ids, "t1")
    off = ex.run(gs, ids, "t2", reuse=False)
    assert on.outputs == off.outputs
    assert on.prefill_tokens_saved > 0 and off.prefill_tokens_saved == 0
    assert {t.decision for t in on.trace} <= {"reuse", "recompute"}
    assert all(t.bytes_moved == 0 for t in on.trace)
    assert len(on.trace) == len(gs.nodes)
    cluster.manager("check_integrity")


def test_transfer_is_chosen_on_a_fast_link_and_moves_real_bytes(cluster):
    ex = _executor(cluster, link_bw=1e12, prefill_b=1e-2)  # prefill very expensive, link very fast
    gs = compile_workflow(references(load_corpus())["GSM8K"])
    ids = cluster.workers["replica-0"].encode(TASK + "(second run)")
    on = ex.run(gs, ids, "t3")
    moved = [t for t in on.trace if t.decision == "transfer"]
    assert moved and all(t.bytes_moved > 0 for t in moved)
    assert all(t.replica == "replica-1" and t.source == "replica-0" for t in moved)
    # the three parallel solvers share the task prefix: it crosses to replica-1 at most once
    assert sum(t.node in ("n1", "n2", "n3") for t in moved) <= 1
    off = ex.run(gs, ids, "t4", reuse=False)
    assert on.outputs == off.outputs


def test_replica_rejects_an_empty_node(cluster):
    with pytest.raises(ValueError, match="at least one context token"):
        cluster.workers["replica-0"].run_node(NodeRun("x", (), 2))


def test_status_reports_prefix_hits(cluster):
    stats = {s["replica"]: s for s in cluster.stats()}
    assert set(stats) == {"replica-0", "replica-1"}
    assert stats["replica-0"]["hits"] > 0 and 0 < stats["replica-0"]["hit_rate"] <= 1
    assert stats["replica-0"]["blocks"] > 0


def test_calibrate_cluster_measures_a_link_that_grows_with_size(cluster):
    cal = calibrate_cluster(cluster)
    assert cal.link.bandwidth_bytes_per_s > 0 and cal.link.latency_s >= 0
    assert cal.kv_bytes_per_token == cluster.workers["replica-0"].kv_bytes_per_token()
    assert cal.model_key == cluster.workers["replica-1"].model_key()
    samples = measure_link(cluster, "replica-0", "replica-1", sizes=(1 << 16, 1 << 22), repeats=2)
    assert [n for n, _ in samples] == [1 << 16, 1 << 22] and all(t > 0 for _, t in samples)
