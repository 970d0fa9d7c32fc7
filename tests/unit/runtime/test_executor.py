from __future__ import annotations

import json

import pytest

from graphflow.client import calibrate_cluster, measure_link
from graphflow.kv.manager import RETAIN_ENDED_S
from graphflow.runtime.executor import WorkflowExecutor
from graphflow.runtime.local import LocalCluster
from graphflow.runtime.plan import NodePlan
from graphflow.workflow.compile import compile_workflow
from graphflow.workflow.corpus import load_corpus, references
from graphflow.workflow.shapes import fan_out_workflow
from scheduler.cost import DecodeModel, LinkSpec, PrefillModel
from scheduler.policy import Option, Policy


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
    assert {t.decision for t in on.nodes} <= {"reuse", "recompute"}
    assert all(t.bytes_moved == 0 for t in on.trace)
    assert len(on.nodes) == len(gs.nodes) == len(off.trace)
    # the root is a row of its own, and its prefill is charged: saved is net of it
    (root,) = [t for t in on.trace if t.decision == "materialize"]
    assert root.node == "ROOT" and on.root_prefill_tokens == root.prefill_tokens == len(ids) > 0
    assert on.prefill_tokens + on.prefill_tokens_saved == off.prefill_tokens
    cluster.manager("check_integrity")


def test_transfer_is_chosen_on_a_fast_link_and_moves_real_bytes(cluster):
    ex = _executor(cluster, link_bw=1e12, prefill_b=1e-2)  # prefill very expensive, link very fast
    gs = compile_workflow(references(load_corpus())["GSM8K"])
    ids = cluster.workers["replica-0"].encode(TASK + "(second run)")
    on = ex.run(gs, ids, "t3")
    moved = [t for t in on.trace if t.decision == "transfer"]
    assert moved and all(t.bytes_moved > 0 for t in moved)
    # only blocks past the destination's own prefix travel: bytes = transferred tokens' KV
    bpt = cluster.workers["replica-0"].kv_bytes_per_token()
    for t, d in zip(on.nodes, on.decisions, strict=True):
        if t.decision == "transfer":
            lo, hi = d.receive
            assert hi > lo and t.bytes_moved == (hi - lo) * bpt
    assert all(t.replica == "replica-1" and t.source == "replica-0" for t in moved)
    # the three parallel solvers share the task prefix: it crosses to replica-1 at most once
    assert sum(t.node in ("n1", "n2", "n3") for t in moved) <= 1
    off = ex.run(gs, ids, "t4", reuse=False)
    assert on.outputs == off.outputs


def test_without_transfers_each_replica_reuses_only_its_own_prefixes(cluster):
    ex = _executor(cluster, link_bw=1e12, prefill_b=1e-2)  # where transfers would win
    gs = compile_workflow(references(load_corpus())["GSM8K"])
    ids = cluster.workers["replica-0"].encode(TASK + "(no transfers)")
    on = ex.run(gs, ids, "no-transfers-1", transfers=False)
    assert on.bytes_moved == 0 and all(t.decision in ("reuse", "recompute", "materialize") for t in on.trace)
    assert all(Option.TRANSFER not in d.predicted_s for d in on.decisions)  # never offered, not merely lost
    assert on.outputs == ex.run(gs, ids, "no-transfers-2", reuse=False).outputs


def test_a_finished_run_leaves_no_state_protected(cluster):
    """Every agent of a fan-out launches in one round, so no later plan of the run clears what
    they protected; the executor's end of run does (else each root stays unevictable for good)."""
    ex = _executor(cluster, link_bw=1e12, prefill_b=1e-2)
    ids = cluster.workers["replica-0"].encode(TASK + "(fan-out)")
    fan = compile_workflow(fan_out_workflow(4))
    ex.run(fan, ids, "protect-1")
    assert all(s.protected_states == 0 for s in cluster.stats())
    with pytest.raises(ValueError):
        ex.run(fan, ids, "protect-2", pin={"nope": "replica-0"})  # refused before any node ran
    assert all(s.protected_states == 0 for s in cluster.stats())


def test_a_finished_run_is_ended_at_the_manager_which_forgets_its_states_later(cluster):
    ex = _executor(cluster, link_bw=1e12, prefill_b=1e-2)
    ids = cluster.workers["replica-0"].encode(TASK + "(forgotten)")
    ex.run(compile_workflow(fan_out_workflow(2)), ids, "forget-1")
    mine = [s for s in cluster.manager("state_ids") if s.startswith("forget-1:")]
    # the root and each node of the workflow, kept for now, and any prefix a node received (``…:transfer``)
    assert len([s for s in mine if not s.endswith(":transfer")]) == 5
    assert all(any(s in w.kept.held for w in cluster.workers.values()) for s in mine)
    later = ex.clock() + RETAIN_ENDED_S
    assert cluster.manager("end_run", "another-run", later) >= len(mine)
    assert not [s for s in cluster.manager("state_ids") if s.startswith("forget-1:")]
    cluster.manager("check_integrity")
    again = ex.run(compile_workflow(fan_out_workflow(2)), ids, "forget-2")  # its blocks are still reused
    assert again.trace[0].prefill_tokens < len(ids)


def test_a_gone_clients_protected_states_are_freed_by_ending_its_runs(cluster, monkeypatch):
    """A client killed mid-run never sends ``end_run``; its plans name it (``Cluster.owner``), so
    the replicas end its runs once told it is gone (what the Ray actor's watch does)."""
    ex = _executor(cluster, link_bw=1e12, prefill_b=1e-2)
    ids = cluster.workers["replica-0"].encode(TASK + "(abandoned)")
    fan = compile_workflow(fan_out_workflow(4))
    call = cluster.call
    monkeypatch.setattr(cluster, "owner", "job-gone")
    monkeypatch.setattr(cluster, "call", lambda r, m, *a: call(r, "queue_length") if m == "end_run" else call(r, m, *a))
    ex.run(fan, ids, "abandoned-1")  # its end_run calls never arrive, as from a killed client
    assert sum(s.protected_states for s in cluster.stats()) > 0
    workers = [cluster.workers[r] for r in cluster.replicas]
    assert set().union(*(w.run_owners() for w in workers)) == {"job-gone"}
    assert [w.end_runs_of({"job-alive"}) for w in workers] == [[], []]
    ended = sum(len(w.end_runs_of({"job-gone"})) for w in workers)
    assert ended >= 1 and all(w.run_owners() == set() for w in workers)
    stats = cluster.stats()
    assert all(s.protected_states == 0 for s in stats) and sum(s.abandoned_runs for s in stats) == ended


def test_replica_rejects_an_empty_node(cluster):
    with pytest.raises(ValueError, match="at least one context token"):
        cluster.workers["replica-0"].run_node(NodePlan("x", (), 2))


def test_status_reports_prefix_hits(cluster):
    stats = {s.replica: s for s in cluster.stats()}
    assert set(stats) == {"replica-0", "replica-1"}
    assert stats["replica-0"].prefix.hits > 0 and 0 < stats["replica-0"].prefix.hit_rate <= 1
    assert stats["replica-0"].blocks > 0
    # --json flattens it: the replica's fields, then its template and prefix-hit counts
    flat = stats["replica-0"].to_json()
    assert flat["blocks"] == stats["replica-0"].blocks and flat["hits"] == stats["replica-0"].prefix.hits
    assert flat["kv_mode"] == "exact" and "templates" not in flat and "prefix" not in flat
    assert json.loads(json.dumps(flat)) == flat


def test_calibrate_cluster_measures_a_link_that_grows_with_size(cluster):
    cal = calibrate_cluster(cluster)
    assert set(cal.links.pairs) == {("replica-0", "replica-1"), ("replica-1", "replica-0")}
    assert all(ln.bandwidth_bytes_per_s > 0 and ln.latency_s >= 0 for ln in cal.links.pairs.values())
    assert cal.policy.resume.per_byte_s >= 0 and cal.policy.reconstruct is None  # exact mode: no rebuilds
    steps = cal.policy.decode  # the engine loops' decode steps, measured on replica-0
    assert steps is not None and steps.rows == (1, 2, 4, 8, 16) and steps.contention >= 1
    assert all(0 < a <= b for row in steps.seconds for a, b in zip(row, row[1:], strict=False))
    assert cal.kv_bytes_per_token == cluster.workers["replica-0"].kv_bytes_per_token()
    assert cal.model_key == cluster.workers["replica-1"].model_key()
    samples = measure_link(cluster, "replica-0", "replica-1", sizes=(1 << 16, 1 << 22), repeats=2)
    assert [n for n, _ in samples] == [1 << 16, 1 << 22] and all(t > 0 for _, t in samples)


def test_a_later_calibration_measures_only_what_changed(cluster):
    first = calibrate_cluster(cluster)
    assert first.measured_now == ("costs", "replica-0>replica-1", "replica-1>replica-0")
    assert first.costs_on == "replica-0" and dict(first.addresses).keys() == {"replica-0", "replica-1"}
    again = calibrate_cluster(cluster, previous=first)  # same processes: everything still holds
    assert again.measured_now == () and again.policy == first.policy and again.links.pairs == first.links.pairs
    # replica-1 restarted (a new transport address): its pairs are measured, the costs kept
    moved = first._replace(addresses=(("replica-0", dict(first.addresses)["replica-0"]), ("replica-1", "elsewhere")))
    assert calibrate_cluster(cluster, previous=moved).measured_now == ("replica-0>replica-1", "replica-1>replica-0")
    # another model's calibration (or another first replica) holds nothing
    assert calibrate_cluster(cluster, previous=first._replace(model_key="other")).measured_now == first.measured_now
    assert "costs" in calibrate_cluster(cluster, previous=first._replace(costs_on="replica-1")).measured_now


def test_pinned_nodes_run_where_pinned_and_the_scheduler_still_moves_their_kv(cluster):
    ex = _executor(cluster, link_bw=1e12, prefill_b=1e-2)  # transfer beats recompute on the pinned replica
    gs = compile_workflow(references(load_corpus())["GSM8K"])
    first = gs.nodes[0].id
    ids = cluster.workers["replica-0"].encode(TASK + "(pinned)")
    on = ex.run(gs, ids, "t5", pin={"ROOT": "replica-0", first: "replica-1"})
    root, node = on.trace[0], next(t for t in on.nodes if t.node == first)
    assert root.replica == "replica-0" and node.replica == "replica-1"
    assert node.decision == "transfer" and node.source == "replica-0" and node.bytes_moved > 0
    # executor-side timings: deciding is part of the latency, the first token comes before the result
    assert 0 < node.decide_s < node.latency_s and 0 < node.first_token_s <= node.latency_s
    # the replica says where its time went, in order, and the phases add up to its own total
    names = [p for p, _ in node.phases]
    assert names[:4] == ["lookup", "receive", "rebuild", "prefill"] and names[-1] == "keep"
    assert sum(s for _, s in node.phases) == pytest.approx(node.measured_s, abs=5e-3)
    with pytest.raises(ValueError, match="no such node"):
        ex.run(gs, ids, "t6", pin={"nope": "replica-0"})
    with pytest.raises(ValueError, match="the deployment's replicas are"):
        ex.run(gs, ids, "t6", pin={first: "replica-9"})


def test_a_context_computed_upstream_is_not_prefilled_again(cluster):
    ex = _executor(cluster, link_bw=1e3, prefill_b=1e-4)
    ids = cluster.workers["replica-0"].encode("(upstream) " + TASK)
    first = ex.materialize_root("up:ROOT", ids, "replica-0")
    again = ex.materialize_root("again:ROOT", ids, "replica-0")
    assert first.prefill_tokens == len(ids) and first.prefill_tokens_saved == 0
    bt = cluster.workers["replica-0"].config.block_tokens
    assert again.prefill_tokens_saved == (len(ids) - 1) // bt * bt and again.prefill_tokens < bt + 1
    gs = compile_workflow(references(load_corpus())["GSM8K"])
    on = ex.run(gs, ids, "t-upstream", pin={"ROOT": "replica-0"})
    assert on.outputs == ex.run(gs, ids, "t-upstream-off", reuse=False).outputs


def test_placement_counts_the_replicas_queues(cluster, monkeypatch):
    assert cluster.queue_lengths() == {"replica-0": 0, "replica-1": 0}
    assert all(s.batching and s.queue == 0 for s in cluster.stats())
    ex = _executor(cluster, link_bw=1e3, prefill_b=1e-4)  # no transfers: each node recomputes or reuses
    gs = compile_workflow(references(load_corpus())["GSM8K"])
    ids = cluster.workers["replica-0"].encode("(queues) " + TASK)
    for busy, idle in (("replica-0", "replica-1"), ("replica-1", "replica-0")):
        # another client's nodes queue on `busy`, which holds the task context: this run's nodes
        # recompute it on `idle` rather than wait there
        monkeypatch.setattr(cluster, "queue_lengths", lambda busy=busy, idle=idle: {busy: 50, idle: 0})
        got = ex.run(gs, ids, f"t-queue-{busy}", pin={"ROOT": busy})
        assert got.trace[0].replica == busy and {t.replica for t in got.nodes} == {idle}


def test_agents_over_one_context_stay_where_it_is_when_moving_it_costs_more_than_their_prefills(cluster):
    """Queued nodes are charged the prefill they were decided to take, not a prefill of the whole
    context each: four branches over a context on replica-0 prefill only their own templates
    there, which together cost less than moving the context to replica-1."""
    w0 = cluster.workers["replica-0"]
    ids = w0.encode("(stay) " + TASK * 4)
    pol = Policy(PrefillModel(0.0, 1e-4, 0.0))
    # moving the context takes half a prefill of it: cheaper than one full prefill, dearer than
    # the branches' own prefills (their templates are far shorter than the context)
    link = LinkSpec("local", len(ids) * w0.kv_bytes_per_token() / (0.5 * pol.prefill(len(ids))), 0.0)
    ex = WorkflowExecutor(cluster, pol, link, w0.kv_bytes_per_token(), w0.model_key(), 6)
    got = ex.run(compile_workflow(fan_out_workflow(4)), ids, "t-stay", pin={"ROOT": "replica-0"})
    branches = [t for t in got.nodes if t.node.startswith("b")]
    assert len(branches) == 4 and {(t.replica, t.decision) for t in branches} == {("replica-0", "reuse")}
    assert all(t.bytes_moved == 0 for t in got.trace)


def test_branches_join_a_transfer_already_bringing_their_prefix_instead_of_waiting_for_it(cluster, monkeypatch):
    """The first branch placed on replica-1 receives the context; the others placed there are
    launched while it moves, wait for those blocks to land (``await_tokens``) and reuse them: the
    context moves once."""
    w0 = cluster.workers["replica-0"]
    ids = w0.encode("(join) " + TASK * 2)
    ex = _executor(cluster, link_bw=1e12, prefill_b=1e-2)  # prefill dear, link fast: spread the branches
    fan = compile_workflow(fan_out_workflow(4))
    plans: list[NodePlan] = []
    call = cluster.call

    def recording(replica, method, *args):
        if method == "run_node":
            plans.append(args[0])
        return call(replica, method, *args)

    monkeypatch.setattr(cluster, "call", recording)
    got = ex.run(fan, ids, "t-join", pin={"ROOT": "replica-0"})
    monkeypatch.setattr(cluster, "call", call)
    joined = [p for p in plans if p.await_tokens]
    assert joined and all(p.option is Option.REUSE and p.receive == (0, 0) for p in joined)
    branches = [t for t in got.nodes if t.node.startswith("b")]
    there = [t for t in branches if t.replica == "replica-1"]
    assert [t.decision for t in there].count("transfer") == 1 and len(there) >= 2, branches
    assert all(t.decision == "reuse" and t.prefill_tokens < len(ids) for t in there if t.decision != "transfer")
    moved = sum(t.bytes_moved for t in got.trace)
    assert moved == max(t.bytes_moved for t in got.trace) > 0  # one transfer's bytes, no second copy
    assert got.outputs == ex.run(fan, ids, "t-join-off", reuse=False).outputs


@pytest.mark.parametrize(
    ("steps", "spread"),
    [
        # a step costs the same for any rows and replicas stepping together slow each other 2×: stay
        (((1, 2, 16), (100, 200), ((1.0, 1.0, 1.0), (1.0, 1.0, 1.0)), 2.0), False),
        # a second row makes every step 1,000× dearer: each branch is worth a replica of its own
        (((1, 2, 16), (100, 200), ((0.01, 10.0, 150.0), (0.01, 10.0, 150.0)), 1.0), True),
    ],
)
def test_the_decode_term_keeps_branches_on_a_busy_replica_or_spreads_them(cluster, steps, spread):
    w0 = cluster.workers["replica-0"]
    ids = w0.encode(f"(decode {spread}) " + TASK * 2)
    pol = Policy(PrefillModel(0.0, 1e-2, 0.0), decode=DecodeModel(*steps))  # prefill dear, the link fast
    ex = WorkflowExecutor(cluster, pol, LinkSpec("local", 1e12, 1e-5), w0.kv_bytes_per_token(), w0.model_key(), 6)
    got = ex.run(compile_workflow(fan_out_workflow(4)), ids, f"t-decode-{spread}", pin={"ROOT": "replica-0"})
    branches = {t.replica for t in got.nodes if t.node.startswith("b")}
    assert branches == ({"replica-0", "replica-1"} if spread else {"replica-0"})


def test_a_branch_follows_its_sibling_to_where_their_prefix_is_read(cluster):
    w0 = cluster.workers["replica-0"]
    ids = w0.encode("(siblings) " + TASK * 2)
    # any rows cost the same; each 100 KV tokens a step reads cost a second more
    steps = DecodeModel((1, 2), (100, 200), ((1.0, 1.0), (2.0, 2.0)), 1.0)
    pol = Policy(PrefillModel(0.0, 1e-2, 0.0), decode=steps)  # prefill dear, the link fast
    ex = WorkflowExecutor(cluster, pol, LinkSpec("local", 1e12, 1e-5), w0.kv_bytes_per_token(), w0.model_key(), 6)
    # replica-0 steps over a shorter context of another run
    ex.in_flight.add("another-run", "x", "replica-0", None, len(ids) // 2, 0.0)
    got = ex.run(compile_workflow(fan_out_workflow(2)), ids, "t-siblings", pin={"ROOT": "replica-0"})
    branches = sorted((t.replica, t.decision) for t in got.nodes if t.node.startswith("b"))
    # the first moves the root off the busy replica; the second reads it there too: on replica-0 it
    # would read less in all, but one prefix more
    assert branches == [("replica-1", "reuse"), ("replica-1", "transfer")], branches
    batches = ex.in_flight.batches(["replica-0", "replica-1"], {}, 1)
    assert batches["replica-0"].rows == 1 and batches["replica-1"].rows == 0  # the run's nodes are done
    ex.in_flight.end_run("another-run")


def test_a_run_past_its_timeout_is_given_up_and_ended(cluster, monkeypatch):
    import time

    from graphflow.runtime.errors import RunTimeout

    ex = _executor(cluster, link_bw=1e3, prefill_b=1e-4)
    gs = compile_workflow(fan_out_workflow(2))
    ids = cluster.workers["replica-0"].encode(TASK + "(timeout)")
    with pytest.raises(ValueError, match="timeout must be more than 0 s, got 0"):
        ex.run(gs, ids, "late-0", timeout_s=0)
    for w in cluster.workers.values():
        slow = w.run_node
        monkeypatch.setattr(w, "run_node", lambda plan, slow=slow: time.sleep(1.0) or slow(plan))
    start = time.perf_counter()
    n = len(gs.nodes)
    with pytest.raises(RunTimeout, match=rf"did not finish within 0.4 s \(0 of {n} nodes done\)"):
        ex.run(gs, ids, "late-1", timeout_s=0.4)
    assert time.perf_counter() - start < 1.0  # given up at the deadline, not when the nodes end
    time.sleep(1.5)  # the nodes end on their replicas; the run was ended, so they protect nothing
    assert all(s.protected_states == 0 for s in cluster.stats())
    with pytest.raises(RunTimeout, match=rf"\(0 of {n} nodes done\)"):
        ex.run(gs, cluster.workers["replica-0"].encode(TASK + "(root late)"), "late-2", timeout_s=1e-6)
    monkeypatch.undo()
    assert len(ex.run(gs, ids, "late-3", timeout_s=60).nodes) == n  # in time: as without a limit
