"""The deployment sweep's logic on in-process replicas (the same executor and replica code)."""

from __future__ import annotations

import pytest

from graphflow.bench.sweep_points import summarize
from graphflow.bench.sweep_served import parse_pairs, sweep_deployment
from graphflow.client import Client, calibrate_cluster
from graphflow.runtime.executor import WorkflowExecutor
from graphflow.runtime.local import LocalCluster
from scheduler.policy import Option

REPLICAS = ["graphflow-replica-0", "graphflow-replica-1", "graphflow-replica-2"]


def test_pairs_default_to_every_ordered_pair_and_accept_short_names():
    assert len(parse_pairs("", REPLICAS)) == 6
    assert parse_pairs("replica-0:replica-2, graphflow-replica-1:replica-0", REPLICAS) == [
        ("graphflow-replica-0", "graphflow-replica-2"),
        ("graphflow-replica-1", "graphflow-replica-0"),
    ]
    for bad in ("replica-0:replica-0", "replica-0", "replica-0:replica-7"):
        with pytest.raises(ValueError, match="SOURCE:DESTINATION"):
            parse_pairs(bad, REPLICAS)


def test_a_sweep_runs_both_options_through_the_served_code_and_grades_the_policy():
    cluster = LocalCluster("tiny-llama", replicas=2)
    try:
        cal = calibrate_cluster(cluster)
        ex = WorkflowExecutor(cluster, cal.policy, cal.links, cal.kv_bytes_per_token, cal.model_key, 1)
        pairs = [("replica-0", "replica-1")]
        rows = sweep_deployment(Client(cluster, ex), "tiny-llama", [64, 160], 1, pairs)
    finally:
        cluster.close()
    assert [r.context for r in rows] == [64, 160] and {r.link for r in rows} == {"replica-0>replica-1"}
    bpt = cal.kv_bytes_per_token
    for r in rows:
        # the forced transfer moved the context's whole blocks; both options were timed
        assert r.nbytes == r.context // 16 * 16 * bpt and r.measured_transfer_s > 0
        assert r.measured_recompute_s > 0 and r.policy.predicted_s[Option.TRANSFER] > 0
        assert (r.src, r.dst) == pairs[0]
        row = r.csv_row()
        assert row["decision"] in ("transfer", "recompute") and row["oracle"] == r.oracle.value
        assert list(row)[:4] == ["model", "link", "src", "dst"]
    summary = summarize(rows)
    assert summary.points == 2 and 0 <= summary.decision_accuracy <= 1 and summary.regret >= 0
