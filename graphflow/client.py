"""Ray-client submission API: ``connect(address).run(task=...)``.

``connect()`` with no address starts an embedded local Ray and a deployment (tests, laptop);
``connect("ray://host:10001")`` attaches to a deployment started by ``graphflow serve``.
Decisions use costs measured on the live replicas (a few prefills, cache rebuilds from blocks,
template rebuilds from base + residual where the deployment serves them, and probe transfers
at up to three sizes between every ordered pair of replicas, fastest of three each, once where
a probe is slow): ``graphflow serve`` measures them and shares them on the deployment's board
(a later ``serve`` re-measures only a restarted replica's); an embedded or recalibrating client
measures its own.
"""

from __future__ import annotations

import itertools
import statistics
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from graphflow.runtime.batch_limits import MAX_BATCH_TOKENS
from graphflow.runtime.errors import RunTimeout, error_message
from graphflow.runtime.executor import WorkflowExecutor
from graphflow.runtime.run_state import Deadline
from graphflow.runtime.stats import ReplicaStats
from graphflow.runtime.trace import NodeTrace, RunResult
from graphflow.workflow.compile import compile_workflow
from graphflow.workflow.corpus import Workflow
from graphflow.workflow.tasks import require_task
from scheduler.calibrate import fit_decode, fit_linear, fit_link, fit_prefill
from scheduler.cost import DecodeModel, LinkMatrix, LinkSpec
from scheduler.policy import Policy
from transport.ids import transfer_ids

__all__ = [
    "CALIBRATION_KEY",
    "Calibration",
    "Client",
    "TaskOutcome",
    "calibrate_cluster",
    "check_decode_steps",
    "connect",
    "measure_link",
    "measure_pair",
    "new_run_id",
]

_probe_ids = transfer_ids()


class Calibration(NamedTuple):
    """Measured costs the executor decides with, and what they were measured on: the replica
    whose engine gave the costs and each replica's transport address then (a restarted replica
    has a new one), so a later pass re-measures only what changed (:func:`calibrate_cluster`)."""

    policy: Policy
    links: LinkMatrix
    kv_bytes_per_token: int
    model_key: str
    costs_on: str = ""
    addresses: tuple[tuple[str, str], ...] = ()  # (replica, transport address)
    measured_now: tuple[str, ...] = ()  # what the pass that made it measured: "costs", "src>dst"


# NOTE: off the round sizes users (and the deployment sweep) measure, so no prediction is
# graded on a point it was fitted on; the longest near the longest contexts served (a fit up to
# 2560 tokens over-predicted SmolLM2's prefill at 4K by 6-19%)
CALIBRATION_PREFILL_TOKENS = (96, 384, 1536, 3584)
CALIBRATION_RESUME_TOKENS = (384, 1536)  # a cache rebuild is linear in bytes
DECODE_ROWS = (1, 2, 4, 8, 16)  # rows of the decode steps calibration times, at two contexts
CONTENTION_STEPS = 8  # single-row steps timed alone, then on every replica at once
# NOTE: rounds of (alone, together), the median ratio kept. The factor weighs every placement of
# the deployment (the decode term), and one round is at the mercy of a moment's load: the
# throughput study at e0286ed kept every agent on the holder, which the term does at 1 workflow
# only with a factor above ~1.5, where this 2-core host's replicas measure 1.01-1.06
CONTENTION_ROUNDS = 3
LINK_PROBE_BYTES = (1 << 20, 4 << 20, 16 << 20)
LINK_PROBE_REPEATS = 3
LINK_PROBE_BUDGET_S = 0.25  # a probe this slow is bandwidth-bound: larger sizes add time, not information


def measure_link(
    cluster: Any, src: str, dst: str, sizes: tuple[int, ...] = LINK_PROBE_BYTES, repeats: int = LINK_PROBE_REPEATS
) -> list[tuple[int, float]]:
    """Probe transfers ``src`` → ``dst``: one warm-up, then the fastest of ``repeats`` per size;
    a probe over ``LINK_PROBE_BUDGET_S`` runs once, and sizes after the second stop there.

    The receiver's clock starts when its call begins, so a late sender call only adds delay;
    the minimum over repeats is therefore the estimate least disturbed by a busy machine.
    """
    a_src, a_dst = (cluster.get(cluster.call(r, "address")) for r in (src, dst))

    def once(nbytes: int) -> float:
        tid = next(_probe_ids)
        send = cluster.call(src, "probe", a_dst, nbytes, tid, True)
        recv = cluster.call(dst, "probe", a_src, nbytes, tid, False)
        cluster.get(send)
        return float(cluster.get(recv))

    once(sizes[0])  # connection setup and first-touch allocations
    samples: list[tuple[int, float]] = []
    for n in sizes:
        first = once(n)
        # NOTE: a probe over the budget is the link's time, not the host's noise: once is enough
        best = first if first > LINK_PROBE_BUDGET_S else min([first, *(once(n) for _ in range(repeats - 1))])
        samples.append((n, best))
        if len(samples) >= 2 and samples[-1][1] > LINK_PROBE_BUDGET_S:
            break  # NOTE: a slow link: two sizes well past its latency already give α and β
    return samples


def calibrate_cluster(cluster: Any, previous: Calibration | None = None) -> Calibration:
    """Measure prefill, resume and (outside exact mode) reconstruct costs on the first replica,
    and the link of every ordered replica pair. With ``previous`` (an earlier calibration of
    this deployment) what still holds is kept: the costs, when the first replica is the same
    process serving the same model, and the link of each pair whose two replicas are; the rest
    (a replica started since, or restarted on a node that came back) is measured."""
    r0 = cluster.replicas[0]
    model_key = cluster.get(cluster.call(r0, "model_key"))
    now = {i.name: i.address for i in cluster.manager("list_replicas") if i.name in cluster.replicas}
    was = dict(previous.addresses) if previous is not None and previous.model_key == model_key else {}
    same = {r for r in cluster.replicas if now.get(r) and was.get(r) == now[r]}
    fresh: list[str] = []
    if previous is not None and r0 in same and previous.costs_on == r0:
        policy = previous.policy
    else:
        policy = _measure_costs(cluster, r0)
        fresh.append("costs")
    pairs = {}
    for a, b in itertools.permutations(cluster.replicas, 2):
        kept = previous.links.pairs.get((a, b)) if previous is not None and {a, b} <= same else None
        if kept is None:
            kept = measure_pair(cluster, a, b)
            fresh.append(f"{a}>{b}")
        pairs[(a, b)] = kept
    # one replica: transfers are never chosen; the default answers no pair
    links = LinkMatrix(pairs) if pairs else LinkMatrix({}, LinkSpec("none", 1.0, 1e9))
    bpt = cluster.get(cluster.call(r0, "kv_bytes_per_token"))
    return Calibration(policy, links, bpt, model_key, r0, tuple(sorted(now.items())), tuple(fresh))


def _measure_costs(cluster: Any, r0: str) -> Policy:
    limit = cluster.get(cluster.call(r0, "max_positions"))
    grid = [n for n in CALIBRATION_PREFILL_TOKENS if not limit or n < limit]  # a short model: its own lengths
    prefill = fit_prefill(cluster.get(cluster.call(r0, "prefill_seconds", grid)))
    mode = cluster.get(cluster.call(r0, "stats")).kv_mode
    costs = cluster.get(cluster.call(r0, "cost_samples", [n for n in CALIBRATION_RESUME_TOKENS if n in grid]))
    reconstruct = fit_linear(costs["reconstruct"]) if mode != "exact" else None
    return Policy(prefill, fit_linear(costs["resume"]), reconstruct, decode=_measure_decode(cluster, r0, grid))


def _measure_decode(cluster: Any, r0: str, grid: list[int]) -> DecodeModel | None:
    """Decode steps of ``DECODE_ROWS`` rows over the grid's shortest and middle contexts on
    ``r0``; the contention factor from ``r0``'s single-row steps over the middle context while
    every replica runs them at once, over ``r0``'s alone (the median of ``CONTENTION_ROUNDS``
    rounds). None where replicas have no engine loop."""
    if len(grid) < 2:
        return None  # NOTE: a model this short decodes too little for the term to matter
    short, long = grid[0], grid[len(grid) // 2]
    points = [(rows, n) for n in (short, long) for rows in DECODE_ROWS]
    samples = cluster.get(cluster.call(r0, "decode_seconds", points))
    if not samples:
        return None
    contention = 1.0
    if len(cluster.replicas) > 1:
        probe = [(1, long)]
        ratios = []
        for _ in range(CONTENTION_ROUNDS):
            alone = cluster.get(cluster.call(r0, "decode_seconds", probe, CONTENTION_STEPS))[0][2]
            handles = [cluster.call(r, "decode_seconds", probe, CONTENTION_STEPS) for r in cluster.replicas]
            together = [cluster.get(h) for h in handles]  # NOTE: wait for every replica, keep r0's
            ratios.append(together[cluster.replicas.index(r0)][0][2] / alone)
        contention = statistics.median(ratios)
    return fit_decode(samples, contention)


def measure_pair(cluster: Any, src: str, dst: str) -> LinkSpec:
    """The α-β link ``src`` → ``dst`` from probe transfers (four times larger while noise-bound)."""
    try:
        return fit_link(measure_link(cluster, src, dst), "replica-link", src, dst)
    except ValueError:  # still noise-bound: measure once more with four times the sizes
        samples = measure_link(cluster, src, dst, tuple(4 * n for n in LINK_PROBE_BYTES))
        return fit_link(samples, "replica-link", src, dst)


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """One task of :meth:`Client.run_many`: its result, or the one-sentence reason it was
    refused (``error``; the other tasks went on)."""

    index: int
    task: str
    result: RunResult | None
    error: str = ""
    seconds: float = 0.0  # from its start to its result, queueing for a free slot excluded
    timed_out: bool = False  # given up at its time limit (``RunTimeout``) rather than refused

    @property
    def why(self) -> str:
        """``refused: …`` or ``out of time: …`` (empty when it ran)."""
        if self.result is not None:
            return ""
        return f"{'out of time' if self.timed_out else 'refused'}: {self.error}"


@dataclass
class Client:
    cluster: Any
    executor: WorkflowExecutor
    templates: str = "short"  # the deployment's operation templates (short | detailed)

    def run(
        self,
        task: str,
        workflow: Workflow | None = None,
        reuse: bool = True,
        pin: Mapping[str, str] | None = None,
        transfers: bool = True,
        on_node: Callable[[NodeTrace], None] | None = None,
        timeout_s: float | None = None,
    ) -> RunResult:
        """Have a replica plan a workflow for ``task`` (or take ``workflow``), run it, return output + trace.

        ``pin`` maps node ids (or ``ROOT``, the task context) to the replica they must run on;
        ``transfers=False`` keeps every replica to its own prefixes (per-replica prefix caching);
        ``on_node`` is called with each node's trace as it finishes (progress); past
        ``timeout_s`` (from this call: its encoding and plan included), ``RunTimeout``."""
        require_task(task)
        _require_workflow(workflow)
        deadline = Deadline(timeout_s, 0)
        first = self.cluster.replicas[0]
        ids = self.cluster.call(first, "encode", task)
        if workflow is None:  # NOTE: planned on a replica, which has torch loaded; the client never loads it
            workflow = deadline.result(self.cluster, self.cluster.call(first, "plan", task))
        task_ids = deadline.result(self.cluster, ids)
        graph = compile_workflow(workflow, self.templates)
        return self.executor.run(
            graph,
            task_ids,
            new_run_id(),
            reuse=reuse,
            on_node=on_node,
            pin=pin,
            transfers=transfers,
            timeout_s=timeout_s,
            since=deadline.start,
        )

    def run_many(
        self,
        tasks: Sequence[str],
        concurrency: int = 4,
        reuse: bool = True,
        on_task: Callable[[TaskOutcome], None] | None = None,
        workflow: Workflow | None = None,
        timeout_s: float | None = None,
    ) -> list[TaskOutcome]:
        """Run ``tasks`` through this client, ``concurrency`` workflows in flight at once (the
        replicas' engine loops batch their nodes), each through ``workflow`` where given (else the
        one a replica plans for it); one outcome per task, in order. A task the
        deployment refuses (``ValueError``: longer than the model accepts, …) or that runs past
        ``timeout_s`` (``RunTimeout``) gets its error and
        the others go on; an empty task refuses the whole call before anything runs. ``on_task``
        is called as each one ends (progress)."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be 1 or more, got {concurrency}")
        for task in tasks:
            require_task(task)
        _require_workflow(workflow)

        def one(i: int, task: str) -> TaskOutcome:
            start = time.perf_counter()
            try:
                ran = self.run(task, workflow, reuse=reuse, timeout_s=timeout_s)
                done = TaskOutcome(i, task, ran, seconds=time.perf_counter() - start)
            except (ValueError, RunTimeout) as exc:  # NOTE: a Ray task error wrapping a ValueError is one too
                late = isinstance(exc, RunTimeout)
                done = TaskOutcome(i, task, None, error_message(exc), time.perf_counter() - start, late)
            if on_task is not None:
                on_task(done)
            return done

        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="graphflow-task") as pool:
            return list(pool.map(one, range(len(tasks)), tasks))

    def status(self) -> list[ReplicaStats]:
        return self.cluster.stats()

    def clear_kv(self) -> int:
        """Evict every KV state the replicas keep, except those a running node needs now, and
        tell the manager; returns how many states went. Benchmarks start each trial from empty
        stores with it, so a trial never finds (or is slowed by) an earlier trial's states."""
        handles = [self.cluster.call(r, "clear_kv") for r in self.cluster.replicas]
        events = [e for h in handles for e in self.cluster.get(h)]
        self.cluster.manager("apply", events, self.executor.clock())
        return len(events)

    def served_model(self, wanted: str = "") -> str:
        """The model this deployment serves; ``ValueError`` when ``wanted`` is set and differs."""
        served = self.status()[0].model
        if wanted and wanted != served:
            raise ValueError(f"this deployment serves {served!r}, not {wanted!r}; use one that serves {wanted}")
        return served


CALIBRATION_KEY = "calibration"


def _require_workflow(workflow: object) -> None:
    """Refuse a ``workflow`` that is neither ``None`` nor a :class:`Workflow` (``TypeError``)."""
    if workflow is not None and not isinstance(workflow, Workflow):
        raise TypeError(
            f"workflow must be a graphflow Workflow or None (a replica plans one), not {type(workflow).__name__}; "
            "read one from YAML with graphflow.workflow.corpus.load_yaml_workflows"
        )


def new_run_id() -> str:
    """A fresh workflow run id (state ids are ``run:node``)."""
    return f"run-{uuid.uuid4().hex[:8]}"


def check_decode_steps(decode_steps: int) -> None:
    """Refuse a negative number of decode steps (tokens each node generates after its first)."""
    if decode_steps < 0:
        raise ValueError(f"decode steps (--decode: tokens after a node's first) must be 0 or more, got {decode_steps}")


def connect(
    address: str | None = None,
    model: str = "tiny-llama",
    replicas: int = 2,
    decode_steps: int = 16,
    recalibrate: bool = False,
    kv_mode: str = "exact",
    transport: str = "ucx",
    device: str = "cpu",
    recompute_head: int = 12,
    capacity_mib: int = 1024,
    threads: int = 0,
    prefault_mib: int = 0,
    batching: bool = True,
    max_batch_tokens: int = MAX_BATCH_TOKENS,
    templates: str = "short",
    recompute_fraction: float = 0.0,
    gpus_per_replica: float | None = None,
    memory_price: float = 0.0,
    linear_kernel: str = "auto",
) -> Client:
    """Attach to a deployment at ``address``, or start an embedded one when it is ``None``
    (whose replicas serve template KV in ``kv_mode``: exact, differential or stateless, and
    move KV over ``transport``: ucx or ray, each with ``capacity_mib`` of KV store, ``threads``
    torch threads (0: each node's CPUs shared by the replicas on it), ``gpus_per_replica`` GPUs
    reserved by Ray for each (default one on ``device="cuda"``, none on cpu) and ``prefault_mib``
    of memory faulted in at start for KV the replicas receive (0: on demand; ``graphflow serve``
    faults in the whole capacity by default; the pool hands back what the KV a replica computes
    takes of its store), with ``batching`` (each replica's nodes share forward passes of
    ``max_batch_tokens``) or not; an attached deployment
    keeps what it was served with, and an embedded one of other settings in this process is
    replaced). Workflows are compiled with the deployment's ``templates`` (short or detailed).
    Placement charges ``memory_price`` seconds per GiB of KV a decision adds to a replica (the
    policy's λ; 0: time only), so a copy of a context is made only where it saves more than that;
    an attached client uses the price the deployment was served with. The replicas' linear
    layers run on ``linear_kernel``: ``torch``'s own, ``onednn``, or ``auto`` (whichever
    each replica measures faster at start).

    An attached client uses the calibration ``graphflow serve`` measured and shared, unless
    there is none, it was measured for another model, or ``recalibrate`` asks for a new one.
    """
    check_decode_steps(decode_steps)
    from graphflow.runtime.actors import RayCluster
    from graphflow.runtime.cluster import connect as ray_connect
    from graphflow.runtime.cluster import start_local
    from graphflow.runtime.deployment import Deployment, gpus_for

    if address is None:
        from graphflow.models.registry import resolve

        resolve(model)  # NOTE: an unknown model is one sentence here, not a replica that dies at creation
        want = Deployment(
            model,
            replicas,
            kv_mode,
            capacity_mib << 20,
            transport,
            device,
            gpus_for(device, gpus_per_replica),
            recompute_head=recompute_head,
            threads=threads,
            prefault_bytes=prefault_mib << 20,
            batching=batching,
            max_batch_tokens=max_batch_tokens,
            templates=templates,
            recompute_fraction=recompute_fraction,
            memory_price=memory_price,
            linear_kernel=linear_kernel,
        )  # NOTE: checks the settings before Ray starts
        ray = start_local()
        cluster = RayCluster.start(ray, want, replace_existing=True)
        calibration = calibrate_cluster(cluster)
    else:
        ray = ray_connect(address)
        cluster = RayCluster.attach(ray)
        shared = None if recalibrate else cluster.shared(CALIBRATION_KEY)
        served = cluster.get(cluster.call(cluster.replicas[0], "model_key"))
        if isinstance(shared, Calibration) and shared.model_key == served:
            calibration = shared
        else:
            calibration = calibrate_cluster(cluster)
            cluster.share(CALIBRATION_KEY, calibration)
    served = cluster.deployment()
    lam = served.lam_s_per_byte() if served is not None else 0.0
    executor = WorkflowExecutor(
        cluster,
        replace(calibration.policy, lam_s_per_byte=lam),
        calibration.links,
        calibration.kv_bytes_per_token,
        calibration.model_key,
        decode_steps,
    )
    return Client(cluster, executor, served.templates if served is not None else templates)
