"""Served replicas evict by the manager's score with the running workflow's next use, not
oldest first (a replica driven the way the executor drives it; no Ray)."""

from __future__ import annotations

import itertools

import pytest

from graphflow.runtime.executor import WorkflowExecutor
from graphflow.runtime.local import LocalCluster
from graphflow.runtime.order import next_use
from graphflow.runtime.plan import NodePlan, TemplateRef
from graphflow.runtime.replica import ReplicaWorker
from graphflow.runtime.replica_config import ReplicaConfig
from graphflow.workflow.compile import compile_workflow
from graphflow.workflow.corpus import Workflow, WorkflowNode
from scheduler.cost import LinkSpec, PrefillModel
from scheduler.policy import Option, Policy

_names = itertools.count()


def _recomputed_for_the_next_node(eviction: str) -> tuple[int, tuple[int, ...]]:
    """Run r's root is kept first; two other runs' roots arrive after it in a store that holds
    two roots. The node of run r that is ready now reads r's root: how many tokens must it
    prefill, and what does it output?"""
    probe = ReplicaWorker(ReplicaConfig(f"ev-{next(_names)}", "tiny-llama", 1 << 20, transport="local"))
    root_bytes = 64 * probe.kv_bytes_per_token()
    probe.transport.close()
    w = ReplicaWorker(
        ReplicaConfig(
            f"ev-{next(_names)}", "tiny-llama", 2 * root_bytes + root_bytes // 2, transport="local", eviction=eviction
        )
    )
    try:
        roots = {r: w.encode(f"Task of run {r}: " + "numbers to add: 3 4 5. " * 8)[:64] for r in "rqs"}
        assert all(len(t) == 64 for t in roots.values())
        tmpl = w.encode("\n### Step: solve\n")
        ctx = tuple(roots["r"] + tmpl)
        w.materialize("r:ROOT", roots["r"])
        # run r's first node: both of its nodes extend the root, the second is ready too
        first = NodePlan(
            "r:n0",
            ctx,
            2,
            Option.REUSE,
            keep=False,
            local_tokens=64,
            template=TemplateRef("SOLVE", (), len(tmpl)),
            next_use=(("r:ROOT", 0),),
        )
        w.run_node(first)
        w.materialize("q:ROOT", roots["q"])  # another run's root, newer than r's
        w.materialize("s:ROOT", roots["s"])  # the store is full: one root must go
        second = NodePlan(
            "r:n1", ctx, 4, Option.REUSE, keep=True, local_tokens=64, template=TemplateRef("SOLVE", (), len(tmpl))
        )
        res = w.run_node(second)
        return res.prefill_tokens, res.output_ids
    finally:
        w.transport.close()


def test_the_state_the_next_node_needs_is_kept_over_an_older_idle_one():
    score_prefill, score_out = _recomputed_for_the_next_node("score")
    oldest_prefill, oldest_out = _recomputed_for_the_next_node("oldest")
    assert score_out == oldest_out  # exact either way; only the work differs
    assert oldest_prefill >= 64  # oldest-first dropped r's root: recomputed
    assert score_prefill < 32  # kept: only the template is prefilled
    assert oldest_prefill - score_prefill == 64


def test_unknown_eviction_policy_is_refused():
    with pytest.raises(ValueError, match="unknown eviction policy 'lru'"):
        ReplicaConfig("x", eviction="lru")


def test_next_use_counts_steps_to_the_node_that_extends_each_state():
    nodes = tuple(WorkflowNode(n, "Custom", "SOLVE") for n in ("a", "b", "c", "d"))
    wf = Workflow("w", "t", nodes, (("a", "b"), ("b", "c"), ("a", "d"), ("c", "d")), ("d",))
    gs = compile_workflow(wf)  # a (ROOT) → b (a) → c (b); d fans in (a, c): forks ROOT
    assert dict(next_use(gs, set(), ["a"], "r")) == {"r:ROOT": 0, "r:a": 1, "r:b": 2}
    assert dict(next_use(gs, {"a"}, ["b"], "r")) == {"r:a": 0, "r:b": 1, "r:ROOT": 2}
    assert next_use(gs, {"a", "b", "c", "d"}, [], "r") == ()


def test_served_catalog_times_advance_with_the_clock():
    c = LocalCluster("tiny-llama", replicas=1)  # its manager's epoch is now
    ticks = itertools.count(int(c._manager.catalog.epoch_s) + 10)
    try:
        w = c.workers["replica-0"]
        ex = WorkflowExecutor(
            c,
            Policy(PrefillModel(0.0, 1e-4, 0.0)),
            LinkSpec("local", 1e9, 1e-5),
            w.kv_bytes_per_token(),
            w.model_key(),
            2,
            clock=lambda: float(next(ticks)),
        )
        nodes = (WorkflowNode("a", "Custom", "SOLVE"), WorkflowNode("b", "Custom", "REVIEW"))
        gs = compile_workflow(Workflow("w", "t", nodes, (("a", "b"),), ("b",)))
        task = w.encode("Ann has 3 apples and buys 4 more. How many now? " * 3)
        ex.run(gs, task, "t1")
        cat = c._manager.catalog
        first = float(cat.col("last_used_s")[cat.col("alive")].max())
        ex.run(gs, task, "t2")
        cat = c._manager.catalog
        later = float(cat.col("last_used_s")[cat.col("alive")].max())
        assert 0 < first < later
        assert float(cat.col("lease_until_s")[cat.col("alive")].max()) > later  # the reused prefix is leased
    finally:
        c.close()


def test_a_state_larger_than_the_whole_store_evicts_nothing():
    probe = ReplicaWorker(ReplicaConfig(f"ev-{next(_names)}", "tiny-llama", 1 << 20, transport="local"))
    root_bytes = 64 * probe.kv_bytes_per_token()
    probe.transport.close()
    w = ReplicaWorker(
        ReplicaConfig(f"ev-{next(_names)}", "tiny-llama", root_bytes + root_bytes // 2, transport="local")
    )
    try:
        small = w.encode("numbers to add: 3 4 5. " * 8)[:64]
        w.materialize("a:ROOT", small)
        huge = w.materialize("b:ROOT", w.encode("a much longer context. " * 40)[:192])
        assert not huge.kept and huge.events == ()  # it could never fit: a:ROOT stays
        assert "a:ROOT" in w.kept.held
    finally:
        w.transport.close()
