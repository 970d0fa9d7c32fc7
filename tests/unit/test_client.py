"""Client calls on in-process replicas (the same executor, replica and manager code as served)."""

import threading
import time
from dataclasses import replace
from typing import Any

import pytest
from ray.exceptions import RayTaskError

from graphflow.bench.serve import agents_graph
from graphflow.bench.systems import run_as
from graphflow.client import Client
from graphflow.runtime.errors import RunTimeout
from graphflow.runtime.trace import RunResult


@pytest.fixture(scope="module")
def client(local_client):
    return local_client


def _kept(client: Client) -> tuple[int, int, int]:
    """(states, store bytes, bytes the manager believes held), over the replicas."""
    workers = client.cluster.workers
    return (
        sum(w.stats().states for w in workers.values()),
        sum(w.stats().used_bytes for w in workers.values()),
        sum(client.cluster.manager("used_bytes", r) for r in workers),
    )


def test_clear_kv_empties_every_store_and_the_manager_forgets_it(client):
    ex, replicas = client.executor, client.cluster.replicas
    root = client.cluster.workers[replicas[0]].encode("A shared context the agents all continue. " * 30)
    first = run_as("ours", ex, agents_graph(2), root, replicas, replicas[0])
    states, used, believed = _kept(client)
    assert states > 0 and used > 0 and believed > 0
    assert client.clear_kv() == states
    assert _kept(client) == (0, 0, 0)
    # nothing of the first run is found again: the root is prefilled anew, the outputs unchanged
    again = run_as("ours", ex, agents_graph(2), root, replicas, replicas[0])
    assert again.outputs == first.outputs
    assert again.trace[0].prefill_tokens == len(root)
    assert client.clear_kv() > 0 and client.clear_kv() == 0


def test_clear_kv_keeps_a_state_a_ready_node_needs(client):
    w = client.cluster.workers[client.cluster.replicas[0]]
    w.materialize("needed:ROOT", w.encode("context a ready node reads next. " * 8))
    w.materialize("idle:ROOT", w.encode("context nothing reads any more. " * 8))
    w.kept.held.note_next_use("needed", (("needed:ROOT", 0),))
    try:
        assert [e.state_id for e in w.clear_kv()] == ["idle:ROOT"]
        assert list(w.kept.held) == ["needed:ROOT"]
    finally:
        w.end_run("needed", ())
        w.clear_kv()


def test_a_memory_price_keeps_every_agent_where_its_context_is(client):
    ex, replicas = client.executor, client.cluster.replicas
    root = client.cluster.workers[replicas[0]].encode("A shared context the agents all continue. " * 30)
    client.clear_kv()
    time_only = ex.policy
    ex.policy = replace(time_only, lam_s_per_byte=1.0)  # NOTE: a second per byte: no copy is ever worth it
    try:
        got = run_as("ours", ex, agents_graph(6), root, replicas, replicas[0])
    finally:
        ex.policy = time_only
        client.clear_kv()
    assert got.bytes_moved == 0 and {t.replica for t in got.nodes} == {replicas[0]}
    assert len(got.decisions) == 6
    for d in got.decisions:  # every option was scored with its new bytes priced
        assert all(d.scores[o] == pytest.approx(d.predicted_s[o] + d.new_bytes[o]) for o in d.scores)


def test_negative_decode_steps_are_refused_before_anything_starts():
    from graphflow.client import connect

    with pytest.raises(ValueError, match="must be 0 or more"):
        connect(decode_steps=-3)  # NOTE: refused before Ray is started or attached to


@pytest.mark.parametrize(
    ("settings", "says"),
    [({"model": "nope"}, "unknown model 'nope'; known models"), ({"kv_mode": "x"}, "unknown KV mode 'x'")],
)
def test_an_embedded_deployment_checks_its_settings_before_ray_starts(monkeypatch, settings, says):
    from graphflow.client import connect
    from graphflow.runtime import cluster

    monkeypatch.setattr(cluster, "start_local", lambda *_a, **_k: pytest.fail("Ray was started"))
    with pytest.raises(ValueError, match=says):
        connect(None, **settings)


class _Runs(Client):
    """``Client.run_many`` over a stand-in ``run`` (no replicas): records how many tasks were in
    flight at once and refuses the tasks that say so, as the deployment would."""

    def __init__(self) -> None:
        super().__init__(cluster=None, executor=None)  # type: ignore[arg-type]
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most = 0
        self.workflows: list[Any] = []

    def run(self, task: str, workflow: Any = None, reuse: bool = True, **_: Any) -> Any:
        self.workflows.append(workflow)
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            time.sleep(0.02)
            if "late" in task:
                raise RunTimeout("the task did not finish within 1 s (0 of 1 nodes done)")
            if "too long" in task:  # NOTE: as a replica's refusal reaches the client: Ray's header, traceback
                why = ValueError("the context needs 9001 positions but tiny-llama accepts at most 2048")
                trace = f'Traceback (most recent call last):\n  File "replica_nodes.py", line 229\nValueError: {why}'
                raise RayTaskError("materialize", trace, why, "ray::ReplicaActor.materialize()").as_instanceof_cause()
            return RunResult({}, {}, task.upper(), ())
        finally:
            with self.lock:
                self.in_flight -= 1


def test_run_many_keeps_order_bounds_concurrency_and_goes_on_past_a_refused_task():
    client = _Runs()
    seen: list[int] = []
    tasks = [f"task {i}" for i in range(7)] + ["too long"] + ["last"]
    outcomes = client.run_many(tasks, concurrency=3, on_task=lambda o: seen.append(o.index))
    assert [o.index for o in outcomes] == list(range(9)) and sorted(seen) == list(range(9))
    assert [o.result.final if o.result else o.error for o in outcomes][:2] == ["TASK 0", "TASK 1"]
    assert outcomes[7].result is None
    assert outcomes[7].error == "the context needs 9001 positions but tiny-llama accepts at most 2048"
    assert outcomes[8].result is not None and outcomes[8].result.final == "LAST"
    assert 1 < client.most <= 3  # never more than asked in flight, and more than one at a time
    assert all(o.seconds >= 0.02 for o in outcomes)


def test_a_task_out_of_time_is_its_own_outcome_and_says_so():
    outcomes = _Runs().run_many(["late", "too long", "ok"], timeout_s=1.0)
    assert [o.timed_out for o in outcomes] == [True, False, False]
    assert outcomes[0].why == "out of time: the task did not finish within 1 s (0 of 1 nodes done)"
    assert outcomes[1].why.startswith("refused: the context needs") and outcomes[2].why == ""


def test_run_many_runs_every_task_through_a_given_workflow_or_has_each_planned():
    from graphflow.workflow.corpus import Workflow, WorkflowNode

    mine = Workflow("mine", "gsm8k", (WorkflowNode("n1", "AnswerGenerate", "solve"),), (), ("n1",))
    client = _Runs()
    client.run_many(["a", "b"], concurrency=2, workflow=mine)
    client.run_many(["c"])
    assert client.workflows == [mine, mine, None]


def test_run_many_refuses_bad_input_before_running_anything():
    client = _Runs()
    with pytest.raises(ValueError, match="concurrency must be 1 or more, got 0"):
        client.run_many(["a"], concurrency=0)
    with pytest.raises(ValueError, match="the task is empty"):
        client.run_many(["a", " "])
    with pytest.raises(
        TypeError, match="workflow must be a graphflow Workflow or None .*, not str; read one from YAML"
    ):
        client.run_many(["a"], workflow="wf.yaml")  # type: ignore[arg-type]
    assert client.most == 0


def test_run_refuses_a_workflow_that_is_not_one_before_asking_a_replica(client, monkeypatch):
    monkeypatch.setattr(client.cluster, "call", lambda *_a: pytest.fail("a replica was asked"))
    with pytest.raises(TypeError, match="workflow must be a graphflow Workflow or None"):
        client.run("Add 2 and 3.", workflow={"nodes": []})  # type: ignore[arg-type]


def test_a_task_without_a_workflow_is_planned_on_a_replica(client, monkeypatch):
    """The client asks a replica for the generator's workflow (the replica has torch loaded);
    it runs exactly that workflow's nodes."""
    from graphflow.workflow.compile import compile_workflow
    from graphflow.workflow.planner import Planner

    task = "Add 17 and 25, then multiply the sum by 3."
    expected = Planner.load().generate(task)
    first = client.cluster.workers[client.cluster.replicas[0]]
    assert first.plan(task) == expected
    asked: list[str] = []
    plan = first.plan
    monkeypatch.setattr(first, "plan", lambda t: asked.append(t) or plan(t))
    monkeypatch.setattr(client.executor, "decode_steps", 2)
    result = client.run(task)
    assert asked == [task]
    graph = compile_workflow(expected, client.templates)
    assert sorted(t.node for t in result.nodes) == sorted(n.id for n in graph.nodes)


def test_the_time_limit_counts_from_the_call_so_a_plan_that_hangs_is_given_up(client, monkeypatch):
    first = client.cluster.workers[client.cluster.replicas[0]]
    plan = first.plan
    monkeypatch.setattr(first, "plan", lambda t: time.sleep(1.0) or plan(t))
    start = time.perf_counter()
    with pytest.raises(RunTimeout, match=r"did not finish within 0.3 s \(its workflow not started\)"):
        client.run("Add 17 and 25.", timeout_s=0.3)
    assert time.perf_counter() - start < 0.9
    with pytest.raises(ValueError, match="timeout must be more than 0 s, got -1"):
        client.run("Add 17 and 25.", timeout_s=-1)
    time.sleep(0.8)  # NOTE: the abandoned plan ends before the next test uses the replica


def test_the_contention_factor_is_the_median_of_its_rounds_so_one_busy_moment_does_not_decide_it():
    from graphflow.client import CONTENTION_ROUNDS, _measure_decode

    # r0's single-row step alone, then with every replica stepping: one round caught the host busy
    rounds = iter([(0.030, 0.090), (0.030, 0.0309), (0.030, 0.0312)])
    assert CONTENTION_ROUNDS == 3

    class Replicas:  # the calls _measure_decode makes, answered from the rounds above
        replicas = ["r0", "r1"]
        together = 0.0

        def call(self, replica: str, method: str, points: list[tuple[int, int]], steps: int = 3) -> Any:
            assert method == "decode_seconds"
            if len(points) > 1:  # the step grid
                return [(rows, n, 0.03 * rows) for rows, n in points]
            if replica == "r0" and not self.together:
                alone, self.together = next(rounds)
                return [(1, points[0][1], alone)]
            seconds = self.together
            if replica == self.replicas[-1]:
                self.together = 0.0
            return [(1, points[0][1], seconds)]

        def get(self, answer: Any) -> Any:
            return answer

    model = _measure_decode(Replicas(), "r0", [96, 384, 1536])
    assert model is not None and model.contention == pytest.approx(1.04)  # of 3.0, 1.03 and 1.04
