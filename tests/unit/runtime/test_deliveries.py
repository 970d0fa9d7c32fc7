from __future__ import annotations

import time

import pytest

from graphflow.kv.errors import MissingBlocks
from graphflow.kv.events import EvictEvent
from graphflow.kv.keys import chain_keys
from graphflow.kv.state_index import run_of
from graphflow.runtime.deliveries import RUNS_TRACKED, Deliveries
from graphflow.runtime.errors import RunTimeout
from graphflow.runtime.executor import WorkflowExecutor
from graphflow.runtime.local import LocalCluster
from graphflow.runtime.plan import NodePlan
from graphflow.workflow.compile import compile_workflow
from graphflow.workflow.shapes import fan_out_workflow
from scheduler.cost import LinkSpec, PrefillModel
from scheduler.policy import Option, Policy


def _ev(state: str, *keys: int) -> EvictEvent:
    return EvictEvent("r0", keys, state)


_TASK = "A train leaves at 9 and travels 60 km per hour. How far has it gone by noon? " * 8


def _none(key: int) -> bool:
    return False


def test_run_of_a_state_id():
    assert run_of("run-1:a0") == "run-1" and run_of("run-1:a0:transfer") == "run-1"
    assert run_of("upstream-7") == ""


def test_undelivered_results_give_back_their_states_and_their_evictions_wait():
    d = Deliveries()
    d.sent("r1:a", ["r1:a"], [_ev("old", 1)])
    d.sent("r1:b", ["r1:b", "r1:b:transfer"], [_ev("older", 2)])
    d.sent("r1:c", [], [])
    d.sent("upstream-1", ["upstream-1"], [_ev("x", 3)])  # of no run: never asked about
    assert d.runs() == 1
    assert d.end_run("r1", {"r1:a", "r1:c"}) == ["r1:b", "r1:b:transfer"]
    assert d.take(_none) == (_ev("older", 2),) and d.take(_none) == ()
    assert d.end_run("r1", ()) == [] and d.runs() == 0  # forgotten once ended


def test_waiting_evictions_go_out_oldest_first_and_a_gone_client_s_run_is_forgotten():
    d = Deliveries()
    d.wait([_ev("a", 1)])
    d.sent("r2:x", ["r2:x"], [_ev("b", 2)])
    d.wait([_ev("c", 3)], released=1)
    assert d.waiting() == 2 and d.take(_none) == (_ev("a", 1), _ev("c", 3)) and d.released == 1
    d.forget("r2")
    assert d.end_run("r2", ()) == [] and d.waiting() == 0


def test_a_waiting_eviction_leaves_out_the_blocks_held_again():
    """An eviction that waited (its result went uncollected) can be older than a delivered admit
    of the same block: sent late, it would tell the manager a block is gone that is there."""
    d = Deliveries()
    d.wait([_ev("a", 1, 2), _ev("b", 3)])
    assert d.take(lambda key: key in (2, 3)) == (_ev("a", 1),) and d.waiting() == 0


def test_only_the_latest_runs_are_tracked():
    d = Deliveries()
    for i in range(RUNS_TRACKED + 3):
        d.sent(f"run-{i}:n", [f"run-{i}:n"], [])
    assert d.runs() == RUNS_TRACKED
    assert d.end_run("run-0", ()) == []  # the oldest were dropped
    assert d.end_run(f"run-{RUNS_TRACKED + 2}", ()) == [f"run-{RUNS_TRACKED + 2}:n"]


def test_what_a_late_node_changes_reaches_the_manager_and_what_it_keeps_does_not_stay(monkeypatch):
    """A node still running when its run timed out ends on its replica later: it keeps nothing
    (the manager would never hear of it), and the states it evicted to make room reach the
    manager with the replica's next result, so the manager's view matches the store again."""
    small = LocalCluster("tiny-llama", replicas=1, capacity_bytes=600_000)
    try:
        (w,) = small.workers.values()
        pol = Policy(PrefillModel(0.0, 1e-4, 0.0))
        ex = WorkflowExecutor(small, pol, LinkSpec("local", 1e3, 1e-5), w.kv_bytes_per_token(), w.model_key(), 6)
        gs = compile_workflow(fan_out_workflow(2))

        def agree() -> bool:
            return small.manager("used_bytes", "replica-0") == w.store.used_bytes

        ex.run(gs, w.encode(_TASK + "(first)"), "first")
        assert agree() and w.store.used_bytes > 500_000  # the next run must evict to fit
        slow = w.run_node
        monkeypatch.setattr(w, "run_node", lambda plan: time.sleep(0.5) or slow(plan))
        with pytest.raises(RunTimeout):
            ex.run(gs, w.encode(_TASK + "(late)"), "late", timeout_s=0.3)
        time.sleep(2.5)  # its first nodes end on the replica, evicting states of "first" to fit
        assert not [s for s in w.kept.held if s.startswith("late:") and s != "late:ROOT"]
        assert not agree() and w.deliveries.waiting() > 0  # evictions the manager has not heard of
        (st,) = small.stats()
        assert st.released_unread >= 1 and st.evictions_waiting == w.deliveries.waiting()
        monkeypatch.undo()
        ex.run(gs, w.encode(_TASK + "(next)"), "next")
        assert agree() and w.deliveries.waiting() == w.deliveries.runs() == 0
        # a state released by hand: the manager hears of it with the next result too
        assert w.release("next:join") > 0 and not agree() and w.deliveries.waiting() == 1
        with pytest.raises(ValueError, match="replica-0 keeps no state 'next:join'; nothing released"):
            w.release("next:join")
        ex.run(gs, w.encode(_TASK + "(after)"), "after")
        assert agree()
        small.manager("check_integrity")
    finally:
        small.close()


def test_a_send_that_finds_its_blocks_gone_tells_the_manager_with_the_next_result():
    """The manager asked for blocks it lists on this replica; they are gone (an eviction it has
    not heard of): the send fails, and the next result evicts them, so no later node plans that
    transfer again."""
    one = LocalCluster("tiny-llama", replicas=1)
    try:
        (w,) = one.workers.values()
        ids = w.encode(_TASK + "(never stored here)")
        with pytest.raises(MissingBlocks, match="replica-0 no longer holds"):
            w.send_blocks(ids, 0, "nowhere", 1)
        assert w.deliveries.waiting() == 1
        got = w.materialize("m:ROOT", w.encode("Another context altogether. " * 10))
        (gone,) = [e for e in got.events if isinstance(e, EvictEvent)]
        bt = w.config.block_tokens
        assert gone.replica == "replica-0" and gone.keys == tuple(
            chain_keys(ids[: len(ids) // bt * bt], w.model_key(), bt)
        )
        assert w.deliveries.waiting() == 0
        stamps = [e.stamp for e in got.events]  # in the order the changes happened (graphflow.kv.copy_order)
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps) and stamps[0] > 0
    finally:
        one.close()


def test_a_received_prefix_kept_without_its_node_s_state_reaches_the_manager():
    """A node received a prefix and kept it (``…:transfer``) but its own, longer state did not
    fit: the prefix's admit still reaches the manager, so it lists what the replica holds."""
    bt_probe = LocalCluster("tiny-llama", replicas=1)
    try:
        (p,) = bt_probe.workers.values()
        root = p.encode(_TASK)
        bt = p.config.block_tokens
        root = root[: len(root) // bt * bt]
        room = (len(root) + 2 * bt) * p.kv_bytes_per_token()  # the prefix and a little, not the node
    finally:
        bt_probe.close()
    two = LocalCluster("tiny-llama", replicas=2, capacity_bytes=room)
    try:
        w0, w1 = two.workers["replica-0"], two.workers["replica-1"]
        two.manager("apply", list(w0.materialize("t:ROOT", root).events), time.time())
        ctx = root + w1.encode(" Now show every step of the working, one line per step." * 6)
        plan = NodePlan(
            "t:n1", tuple(ctx), 2, Option.TRANSFER, receive=(0, len(root)), source_address=w0.address(), transfer_id=1
        )
        sent = two.call("replica-0", "send_blocks", root, 0, w1.address(), 1)
        res = w1.run_node(plan)
        assert sent.result() > 0 and res.transferred_tokens == len(root)
        assert res.admit is None and res.kept_prefix is not None  # the node's state did not fit; the prefix did
        assert w1.kept.held and "t:n1:transfer" in w1.kept.held
        two.manager("apply", res.manager_events(), time.time())
        for r, w in two.workers.items():
            assert two.manager("used_bytes", r) == w.store.used_bytes > 0
        two.manager("check_integrity")
    finally:
        two.close()


def test_evictions_no_result_carried_are_reported_without_waiting_for_a_call():
    """A replica that gets no further call hands its waiting evictions to the manager itself (the
    actor does every few seconds); a report that fails leaves them waiting, first in line."""
    one = LocalCluster("tiny-llama", replicas=1)
    try:
        (w,) = one.workers.values()
        for name in ("a", "b"):
            got = w.materialize(f"r:{name}", w.encode(f"Context {name}. " * 20))
            one.manager("apply", list(got.events), time.time())
        assert w.release("r:a") > 0 and w.release("r:b") > 0 and w.deliveries.waiting() == 2
        first = w.deliveries._waiting[0]

        def down(events: list[EvictEvent]) -> None:
            raise ConnectionError("the manager is restarting")

        with pytest.raises(ConnectionError):
            w.report_waiting(down)
        assert w.deliveries.waiting() == 2 and w.deliveries._waiting[0] == first
        assert one.manager("used_bytes", "replica-0") > w.store.used_bytes == 0
        assert w.report_waiting(lambda events: one.manager("apply", events, time.time())) == 2
        assert one.manager("used_bytes", "replica-0") == 0 and w.deliveries.waiting() == 0
        assert w.report_waiting(lambda events: pytest.fail("nothing to report")) == 0
        one.manager("check_integrity")
    finally:
        one.close()
