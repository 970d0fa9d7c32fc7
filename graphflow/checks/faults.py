"""Fault-injection suite: GraphFlow keeps answering correctly while things break.

``graphflow check faults --json`` deploys replicas on a local Ray cluster and runs each
scenario against a reference (the same workflow with every reuse and transfer off, which
involves no KV state at all). A scenario *completes* when every request it sends returns, and
its *outputs are correct* when they equal the reference token for token (exact mode).

1. ``replica-dies`` — a replica actor is killed after the first node, while others run on it.
2. ``transfer-fails`` — the source replica drops its next send (the receiver times out), then,
   on a fresh deployment, its send fails as if its blocks were evicted (the executor calls the
   receive off: the node is recomputed at once, not at the deadline).
3. ``corrupt-bytes`` — a byte flips on the wire (after the checksum), then in stored blocks.
4. ``manager-restart`` — the KV manager actor is killed mid-workflow; the next call restarts
   it from its last Parquet snapshot plus what the replicas report holding.
5. ``memory-pressure`` — replicas get 50% of the working set measured unconstrained.
6. ``load`` — N concurrent workflows (default 32) on 2 replicas; p50/p99 latency.
7. ``bad-input`` — malformed requests each get one clear error; a good request still works.
8. ``node-dies`` (``--nodes N``, N ≥ 2) — on a namespace cluster of N Ray nodes (one replica
   per node, ``graphflow cluster``), the last node (its raylet and every process) is killed
   after the first node of a workflow; the workflow finishes on the other nodes, the dead node
   shows in the cluster's node list, and a restarted node serves the next scenario again.

With ``--nodes N`` every scenario runs on that cluster (replicas spread, one per node) instead
of an embedded single-node Ray; it needs root and iproute2.

Scenarios 2 and 3 need a transfer to be attempted, so their executor uses a cost model that
favours transfers (stated in the row's detail); every other scenario uses the costs measured
on the live replicas.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from graphflow.checks.fault_report import NODE_SCENARIOS, SCENARIOS, FaultReport, ScenarioResult
from graphflow.checks.foreign_blocks import send_foreign_blocks
from graphflow.client import calibrate_cluster
from graphflow.runtime.actors import NAMESPACE, RayCluster, replica_name
from graphflow.runtime.deployment import Deployment
from graphflow.runtime.errors import error_message, root_cause
from graphflow.runtime.executor import WorkflowExecutor
from graphflow.runtime.trace import NodeTrace, RunResult
from graphflow.workflow.compile import compile_workflow
from graphflow.workflow.corpus import Workflow, WorkflowNode, functional_role, load_corpus, references
from scheduler.cost import LinkMatrix, LinkSpec, PrefillModel
from scheduler.policy import Policy

__all__ = ["run_faults"]

_TASKS = (
    "A tank holds 40 litres and leaks 3 litres an hour. How much is left after 7 hours? ",
    "Sam buys 4 pens at 3 dollars each and a book at 12 dollars. What does he spend? ",
    "A train covers 180 km in 3 hours. At that speed, how far does it go in 5 hours? ",
    "There are 24 apples shared equally by 6 children. Each eats 1. How many are left each? ",
)


class FaultSuite:
    """One local Ray deployment, reset between scenarios; see the module docstring."""

    def __init__(
        self, ray: Any, model: str, timeout_s: float, decode: int, repeats: int, replicas: int = 2, spread: bool = False
    ) -> None:
        self.ray = ray
        self.replicas = replicas
        self.spread = spread
        self.model = model
        self.timeout_s = timeout_s
        self.decode = decode
        self.snapshot_dir = tempfile.mkdtemp(prefix="graphflow-faults-")
        self.graph = compile_workflow(references(load_corpus())["GSM8K"])
        self.tasks = [t * repeats for t in _TASKS]
        self.cluster = self.deploy()
        self.calibration = calibrate_cluster(self.cluster)
        self.ids = {t: self.cluster.get(self.cluster.call(self.cluster.replicas[0], "encode", t)) for t in self.tasks}
        plain = self.executor()
        self.expected = {
            t: plain.run(self.graph, self.ids[t], f"ref-{i}", reuse=False).outputs for i, t in enumerate(self.tasks)
        }

    # ---- deployment ----------------------------------------------------------------------
    def deploy(self, capacity_bytes: int = 1 << 30, fresh: bool = False) -> RayCluster:
        """The deployment; ``fresh`` replaces the replica actors (empty stores)."""
        if fresh:
            for i in range(self.replicas):
                self._kill_replica(replica_name(i))
        # NOTE: detached, as `graphflow serve` deploys: a non-detached actor would die with the last
        # handle of the deployment object that created it
        want = Deployment(self.model, self.replicas, capacity_bytes=capacity_bytes, spread=self.spread)
        cluster = RayCluster.start(
            self.ray,
            want,
            detached=True,
            replace_existing=fresh,
            snapshot_dir=self.snapshot_dir,
            timeout_s=self.timeout_s,
        )
        self.cluster = cluster
        return cluster

    def _kill_replica(self, name: str) -> None:
        with contextlib.suppress(ValueError):  # not running
            self.ray.kill(self.ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
        known = {i.name for i in self.cluster.manager("list_replicas")}
        if name in known:
            self.cluster.manager("drop_replica", name)
        time.sleep(0.5)  # NOTE: let Ray release the actor's name before it is created again

    def executor(self, favour_transfers: bool = False) -> WorkflowExecutor:
        policy, links, bpt, key = self.calibration[:4]
        if favour_transfers:  # prefill priced high and the link fast, so transfers are chosen
            policy, links = Policy(PrefillModel(0.0, 1e-2, 0.0)), LinkMatrix.uniform(LinkSpec("model", 1e12, 1e-5))
        return WorkflowExecutor(self.cluster, policy, links, bpt, key, self.decode)

    def correct(self, task: str, result: RunResult) -> bool:
        return result.outputs == self.expected[task]

    # ---- scenarios -----------------------------------------------------------------------
    def replica_dies(self) -> ScenarioResult:
        self.deploy()
        task = self.tasks[0]
        done: list[str] = []
        gone = self.cluster.get(self.cluster.call(replica_name(1), "address"))

        def kill_after_first(trace: NodeTrace) -> None:
            done.append(trace.node)
            if len(done) == 1:
                self.ray.kill(self.cluster.handles[replica_name(1)], no_restart=True)

        result = self.executor().run(self.graph, self.ids[task], "faults-kill", on_node=kill_after_first)
        notes = [f"{t.node}: {t.note}" for t in result.trace if t.note]
        # NOTE: stats finds it dead if the run did not; the survivors must then hold no endpoint to it
        stale = [s.replica for s in self.cluster.stats() if any(r.peer == gone for r in s.routes)]
        left = self.cluster.replicas
        detail = f"{replica_name(1)} killed after node {done[0]}; continued on {left}; "
        detail += "; ".join(notes) if notes else "no node was in flight on it"
        if stale:
            detail += f"; {', '.join(stale)} {'holds' if len(stale) == 1 else 'hold'} an endpoint to it still"
        return ScenarioResult("replica-dies", not stale, self.correct(task, result), detail)

    def node_dies(self) -> ScenarioResult:
        """Kill the last Ray node mid-workflow (see the module docstring), then bring it back."""
        from graphflow.harness.cluster import start_node, stop_node

        self.deploy()
        node, victim = self.replicas - 1, replica_name(self.replicas - 1)
        task = self.tasks[2]
        done: list[str] = []

        def kill_after_first(trace: NodeTrace) -> None:
            done.append(trace.node)
            if len(done) == 1:
                stop_node(node)

        pin = {n.id: victim for n in self.graph.nodes[1:]}  # NOTE: work was headed for the node that dies
        result = self.executor().run(self.graph, self.ids[task], "faults-node", on_node=kill_after_first, pin=pin)
        notes = [f"{t.node}: {t.note}" for t in result.trace if t.note]
        dead = [n.host for n in self.cluster.nodes() if not n.alive]
        start_node(node)
        self.deploy()  # the node is back: its replica is started afresh there
        back = victim in self.cluster.replicas
        detail = "; ".join(
            [
                f"node {node} killed after {done[0]}",
                f"dead nodes {dead}",
                *(notes or ["no node was in flight on it"]),
                f"replica back on the restarted node: {back}",
            ]
        )
        return ScenarioResult("node-dies", bool(dead) and back, self.correct(task, result), detail)

    def _transfer_fault(self, name: str, fault: str) -> ScenarioResult:
        self.deploy(fresh=True)
        task = self.tasks[1]
        for r in self.cluster.replicas:
            self.cluster.get(self.cluster.call(r, "inject_fault", fault))
        start = time.perf_counter()
        result = self.executor(favour_transfers=True).run(self.graph, self.ids[task], f"faults-{fault}")
        notes = [f"{t.node}: {t.note}" for t in result.trace if t.note]
        if not notes:
            return ScenarioResult(name, True, False, "no transfer was attempted, so the fault never fired")
        detail = f"cost model favouring transfers; {'; '.join(notes)}; run {time.perf_counter() - start:.1f} s"
        return ScenarioResult(name, True, self.correct(task, result), detail)

    def transfer_fails(self) -> ScenarioResult:
        dropped = self._transfer_fault("transfer-fails", "drop-send")
        lost = self._transfer_fault("transfer-fails", "lose-send")
        return ScenarioResult(
            "transfer-fails",
            dropped.completed and lost.completed,
            dropped.outputs_correct and lost.outputs_correct,
            f"send dropped: {dropped.detail} | blocks lost at the source: {lost.detail}",
        )

    def corrupt_bytes(self) -> ScenarioResult:
        wire = self._transfer_fault("corrupt-bytes", "corrupt-send")
        task = self.tasks[1]
        for r in self.cluster.replicas:
            self.cluster.get(self.cluster.call(r, "inject_fault", "corrupt-store"))
        again = self.executor().run(self.graph, self.ids[task], "faults-corrupt-store")
        ok = wire.outputs_correct and self.correct(task, again)
        self.cluster.manager("check_integrity")
        detail = f"wire: {wire.detail}; stored: every block flipped, rerun correct={self.correct(task, again)}"
        return ScenarioResult("corrupt-bytes", True, ok, detail)

    def manager_restart(self) -> ScenarioResult:
        self.deploy()
        task = self.tasks[2]
        self.executor().run(self.graph, self.ids[task], "faults-mgr-warm")
        done: list[str] = []

        def kill_manager(trace: NodeTrace) -> None:
            done.append(trace.node)
            if len(done) == 1:
                self.cluster.kill_manager()

        result = self.executor().run(self.graph, self.ids[task], "faults-mgr", on_node=kill_manager)
        self.cluster.manager("check_integrity")
        after = self.executor().run(self.graph, self.ids[task], "faults-mgr-after")
        ok = self.correct(task, result) and self.correct(task, after)
        return ScenarioResult(
            "manager-restart",
            True,
            ok,
            f"manager killed after node {done[0]}; restored from {self.snapshot_dir} + replica "
            f"holdings; next run saved {after.prefill_tokens_saved} prefill tokens",
        )

    def memory_pressure(self) -> ScenarioResult:
        tasks = self.tasks[:2]
        self.deploy(fresh=True)
        for i, t in enumerate(tasks):
            self.executor().run(self.graph, self.ids[t], f"faults-ws-{i}")
        working_set = max(s.peak_bytes for s in self.cluster.stats())
        budget = working_set // 2
        self.deploy(budget, fresh=True)
        results = [self.executor().run(self.graph, self.ids[t], f"faults-mem-{i}") for i, t in enumerate(tasks)]
        stats = self.cluster.stats()
        within = all(s.peak_bytes <= s.capacity_bytes == budget for s in stats)
        ok = within and all(self.correct(t, r) for t, r in zip(tasks, results, strict=True))
        peaks = ", ".join(f"{s.replica} peak {s.peak_bytes / 2**20:.1f} MiB" for s in stats)
        detail = f"working set {working_set / 2**20:.1f} MiB, budget {budget / 2**20:.1f} MiB; {peaks}"
        self.deploy(fresh=True)  # back to full budgets for what follows
        return ScenarioResult("memory-pressure", True, ok, detail)

    def load(self, n: int) -> ScenarioResult:
        self.deploy()
        jobs = [self.tasks[i % len(self.tasks)] for i in range(n)]

        def one(i: int) -> tuple[bool, float]:
            start = time.perf_counter()
            r = self.executor().run(self.graph, self.ids[jobs[i]], f"faults-load-{i}")
            return self.correct(jobs[i], r), time.perf_counter() - start

        with cf.ThreadPoolExecutor(max_workers=n) as pool:
            futures = [pool.submit(one, i) for i in range(n)]
            outcomes = []
            lost = 0
            for f in futures:
                try:
                    outcomes.append(f.result())
                except Exception:
                    lost += 1
        lat = sorted(t for _, t in outcomes)
        p50 = statistics.median(lat) if lat else float("nan")
        p99 = lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))] if lat else float("nan")
        return ScenarioResult(
            "load",
            lost == 0,
            lost == 0 and all(ok for ok, _ in outcomes),
            f"{n} concurrent workflows on {self.replicas} replicas: p50 {p50:.2f} s, p99 {p99:.2f} s",
            lost_requests=lost,
        )

    def bad_input(self) -> ScenarioResult:
        c = self.cluster
        limit = int(c.get(c.call(c.replicas[0], "max_positions")))
        cases: list[tuple[str, Callable[[], Any]]] = [
            (
                "cyclic workflow",
                lambda: Workflow(
                    "cyc",
                    "x",
                    (WorkflowNode("a", "Custom", "SOLVE"), WorkflowNode("b", "Custom", "REVIEW")),
                    (("a", "b"), ("b", "a")),
                    ("b",),
                ),
            ),
            ("unknown operation", lambda: functional_role("Teleport", None)),
            ("over-long context", lambda: self.executor().run(self.graph, [65] * (limit + 1), "faults-long")),
            ("empty task", lambda: self.executor().run(self.graph, [], "faults-empty")),
            (
                "KV blocks of another model sent to a replica",
                lambda: send_foreign_blocks(c, list(self.ids[self.tasks[0]][:64]), self.timeout_s),
            ),
        ]
        errors = []
        for label, call in cases:
            try:
                call()
            except (ValueError, RuntimeError, LookupError) as exc:
                errors.append(f"{label}: {error_message(exc)[:160]}")
            else:
                return ScenarioResult("bad-input", True, False, f"{label} was accepted")
        task = self.tasks[3]
        good = self.executor().run(self.graph, self.ids[task], "faults-after-bad")
        detail = (
            "each refused: " + " | ".join(errors) + f"; a good request afterwards correct={self.correct(task, good)}"
        )
        return ScenarioResult("bad-input", True, self.correct(task, good), detail)


def run_faults(
    model: str = "tiny-llama",
    scenarios: tuple[str, ...] = SCENARIOS,
    load: int = 32,
    timeout_s: float = 5.0,
    decode: int = 4,
    repeats: int = 6,
    say: Callable[[str], None] = lambda _m: None,
    nodes: int = 0,
) -> FaultReport:
    """Run the scenarios on an embedded Ray cluster, or with ``nodes`` ≥ 2 on a namespace
    cluster of that many nodes (one replica each, plus the ``node-dies`` scenario)."""
    known = SCENARIOS + (NODE_SCENARIOS if nodes else ())
    unknown = sorted(set(scenarios) - set(known))
    if unknown:
        more = "" if nodes else f" ({', '.join(NODE_SCENARIOS)} needs --nodes)"
        raise ValueError(f"unknown scenarios {unknown}; choose from {', '.join(known)}{more}")
    if nodes == 1 or nodes < 0:
        raise ValueError(f"--nodes takes 2 or more (a multi-node cluster) or 0 (embedded), got {nodes}")
    from graphflow.runtime.cluster import connect, start_local

    cluster = None
    if nodes:
        from graphflow.harness.cluster import ClusterSpec, cluster_down, cluster_up

        say(f"starting a {nodes}-node namespace cluster")
        cluster = cluster_up(ClusterSpec(nodes, "1gbit"), say=say)
    try:
        ray = connect(cluster.client_address) if cluster else start_local()
        replicas = nodes or 2
        say(f"deploying {replicas} replicas of {model} and computing reference outputs")
        suite = FaultSuite(ray, model, timeout_s, decode, repeats, replicas=replicas, spread=bool(nodes))
        runners: dict[str, Callable[[], ScenarioResult]] = {
            "replica-dies": suite.replica_dies,
            "transfer-fails": suite.transfer_fails,
            "corrupt-bytes": suite.corrupt_bytes,
            "manager-restart": suite.manager_restart,
            "memory-pressure": suite.memory_pressure,
            "load": lambda: suite.load(load),
            "bad-input": suite.bad_input,
            "node-dies": suite.node_dies,
        }
        rows: list[ScenarioResult] = []
        try:
            _run_all(scenarios, runners, rows, say)
        finally:
            suite.cluster.shutdown()  # detached actors: stop them, or they outlive the check
            shutil.rmtree(suite.snapshot_dir, ignore_errors=True)
    finally:
        if cluster is not None:
            ray.shutdown()
            cluster_down()
    return FaultReport(tuple(rows))


def _run_all(
    scenarios: tuple[str, ...],
    runners: dict[str, Callable[[], ScenarioResult]],
    rows: list[ScenarioResult],
    say: Callable[[str], None],
) -> None:
    for name in scenarios:
        say(f"scenario {name}")
        start = time.perf_counter()
        try:
            row = runners[name]()
        except Exception as exc:  # a scenario that blows up is a failed, lost request
            row = ScenarioResult(name, False, False, f"{type(root_cause(exc)).__name__}: {error_message(exc)[:200]}", 1)
        rows.append(replace(row, seconds=round(time.perf_counter() - start, 2)))
