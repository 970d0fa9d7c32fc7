"""Ray-client submission API: ``connect(address).run(task=...)``.

``connect()`` with no address starts an embedded local Ray and a deployment (tests, laptop);
``connect("ray://host:10001")`` attaches to a deployment started by ``graphflow serve``. On
connect the client calibrates the scheduler against the live replicas (a few prefills and two
probe transfers), so every decision uses measured costs.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from typing import Any

from graphflow.runtime.executor import RunResult, WorkflowExecutor
from graphflow.workflow.compile import compile_workflow
from graphflow.workflow.corpus import Workflow
from scheduler.calibrate import fit_link, fit_prefill
from scheduler.cost import LinkSpec
from scheduler.policy import Policy

__all__ = ["Client", "calibrate_cluster", "connect"]

_probe_ids = itertools.count(1 << 30)


def calibrate_cluster(cluster: Any) -> tuple[Policy, LinkSpec, int, str]:
    """Measure prefill on the first replica and the replica-to-replica link (if two)."""
    r0 = cluster.replicas[0]
    prefill = fit_prefill(cluster.get(cluster.call(r0, "prefill_seconds", [64, 256, 1024, 2048])))
    bpt = cluster.get(cluster.call(r0, "kv_bytes_per_token"))
    model_key = cluster.get(cluster.call(r0, "model_key"))
    link = LinkSpec("none", 1.0, 1e9)  # one replica: transfers are never chosen
    if len(cluster.replicas) > 1:
        r1 = cluster.replicas[1]
        a0, a1 = (cluster.get(cluster.call(r, "address")) for r in (r0, r1))
        samples = []
        for nbytes in (256 << 10, 1 << 20, 4 << 20):
            tid = next(_probe_ids)
            send = cluster.call(r0, "probe", a1, nbytes, tid, True)
            recv = cluster.call(r1, "probe", a0, nbytes, tid, False)
            cluster.get(send)
            samples.append((nbytes, cluster.get(recv)))
        link = fit_link(samples, "replica-link", r0, r1)
    return Policy(prefill), link, bpt, model_key


@dataclass
class Client:
    cluster: Any
    executor: WorkflowExecutor

    def run(self, task: str, workflow: Workflow | None = None, reuse: bool = True) -> RunResult:
        """Generate (or take) a workflow for ``task``, run it on the replicas, return output + trace."""
        if not task or not task.strip():
            raise ValueError("the task is empty; pass the task's text")
        if workflow is None:
            from graphflow.workflow.planner import Planner

            workflow = Planner.load().generate(task)
        task_ids = self.cluster.get(self.cluster.call(self.cluster.replicas[0], "encode", task))
        return self.executor.run(compile_workflow(workflow), task_ids, f"run-{uuid.uuid4().hex[:8]}", reuse=reuse)

    def status(self) -> list[dict[str, Any]]:
        return self.cluster.stats()


def connect(address: str | None = None, model: str = "tiny-llama", replicas: int = 2, decode_steps: int = 16) -> Client:
    """Attach to a deployment at ``address``, or start an embedded one when it is ``None``."""
    from graphflow.runtime.actors import RayCluster
    from graphflow.runtime.cluster import connect as ray_connect
    from graphflow.runtime.cluster import start_local

    if address is None:
        ray = start_local()
        cluster = RayCluster.start(ray, model, replicas)
    else:
        ray = ray_connect(address)
        cluster = RayCluster.attach(ray)
    policy, link, bpt, model_key = calibrate_cluster(cluster)
    return Client(cluster, WorkflowExecutor(cluster, policy, link, bpt, model_key, decode_steps))
