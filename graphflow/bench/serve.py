"""``graphflow bench serve``: the served path end to end under concurrent workflows.

Every number comes through ``connect()`` → executor → replica actors → manager → transport, on
an embedded deployment started here, once with the engine loop (``runtime.batcher``) and once
without it (the reference), in the same run:

* **throughput** — ``W`` workflows at once, each a fresh ``root_tokens`` context computed
  upstream on replica 0 (materialized before the clock starts, as in ``experiments/throughput``)
  and ``agents`` agent nodes over it, each with its own prompt and ``decode`` generated tokens;
  the scheduler places the agents (reuse on the holder or a transfer); with ``baselines``, the
  same workload (batching on) also runs as ``dense``, ``local`` and ``routed``
  (:mod:`graphflow.bench.systems`: reuse off, and two prefix-caching baselines that never move
  KV). ``tokens_per_s``: every
  agent's generated tokens over the time until the last workflow is done. TTFT per agent is the
  executor's: from its decision to its first token (queueing at the replica included).
  ``kv_bytes``: the bytes the replicas' block stores held at the end. ``peak_rss_bytes``: the
  replicas' resident-memory growth (peak after a reset, minus the start, summed) over the same
  workload run again in a trial of its own once every timed trial is done, or 0 without
  ``row_memory``: resetting hands freed memory, the receive buffers a replica recycles included,
  back to the OS, so a transfer measured so lands in fresh pages, a cost the baselines (which
  never receive) do not pay; the timed trials leave memory alone and measure the replicas in
  steady state, after a full-size warm-up. Every trial (each system at each count) starts
  from empty stores (``Client.clear_kv``).
* **shared root** (``memory_agents`` > 0) — one workflow of ``memory_agents`` agents over one
  ``memory_root``-token context, all on the replica that holds it: its peak growth against the
  same agents with KV reuse off (each agent prefills and holds the whole context: dense).
* **head-of-line** (``hol_prefill`` > 0) — a short node's TTFT on an idle replica, and while the
  same replica prefills ``hol_prefill`` tokens of another workflow.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from graphflow.bench.host_cpu import host_busy_seconds
from graphflow.bench.replica_memory import ReplicaMemory
from graphflow.bench.serve_report import HolRow, MemoryRow, ServeReport, ServeRow, calibration_summary, percentile
from graphflow.bench.served import PinnedAgent
from graphflow.bench.systems import SYSTEMS, run_as
from graphflow.client import Client, connect, new_run_id
from graphflow.runtime.batch_limits import MAX_BATCH_TOKENS
from graphflow.runtime.trace import NodeTrace, RunResult
from graphflow.workflow.compile import ROOT, ExecGraph, ExecNode

__all__ = ["HOLDER", "ServeBench", "agents_graph", "decision_counts", "run_serve_bench"]

HOLDER = "graphflow-replica-0"


def agents_graph(n: int) -> ExecGraph:
    """``n`` agent nodes over the task context, each with a prompt of its own."""
    nodes = tuple(ExecNode(f"agent-{i}", "Custom", "REVIEW", _agent_prompt(i), (), ROOT) for i in range(n))
    return ExecGraph(nodes, (), tuple((ROOT, x.id) for x in nodes), tuple(x.id for x in nodes))


def _agent_prompt(i: int) -> str:
    return (
        f"\nAgent {i} of the review panel: read the analysis above and check each step of its reasoning in turn. "
        "Name the first step that is wrong, if there is one, and say in one sentence why it is wrong. "
        "Then end with the final answer as a single number.\n"
    )


class ServeBench:
    """One deployment's measurements (see the module docstring)."""

    def __init__(self, client: Client, batching: bool, say: Callable[[str], None] = lambda _m: None) -> None:
        self.client = client
        self.batching = batching
        self.say = say
        self.contexts = PinnedAgent(client)
        self.replicas = list(client.cluster.replicas)
        self.memory = ReplicaMemory(client)

    # ---- throughput ----------------------------------------------------------------------
    def throughput(
        self, workflows: int, root_tokens: int, agents: int, system: str = "ours", memory: bool = False
    ) -> ServeRow:
        """One trial; with ``memory`` its replicas' peak growth is measured (and its timing is not
        steady state: see the module docstring)."""
        ex = self.client.executor
        self.client.clear_kv()  # every trial starts from empty stores
        graph = agents_graph(agents)
        roots = [self.contexts.context(root_tokens) for _ in range(workflows)]
        for i, root in enumerate(roots):  # computed upstream: not timed
            ex.materialize_root(f"upstream-{new_run_id()}-{i}", root, HOLDER)
        if memory:
            self.memory.start()
        before = self._counters()
        results: list[RunResult | BaseException] = [RuntimeError("not run")] * workflows

        def one(i: int) -> None:
            try:
                results[i] = run_as(system, ex, graph, roots[i], self.replicas, HOLDER)
            except BaseException as exc:  # the bench reports it below
                results[i] = exc

        begin = time.perf_counter()
        workers = [threading.Thread(target=one, args=(i,)) for i in range(workflows)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        wall = time.perf_counter() - begin
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        runs = [r for r in results if isinstance(r, RunResult)]
        agent_traces = [t for r in runs for t in r.nodes if t.node != ROOT]
        generated = sum(len(out) for r in runs for out in r.outputs.values())
        ttfts = [t.first_token_s for t in agent_traces]
        decisions = decision_counts(agent_traces)
        growth, kv = self.memory.growth() if memory else 0, self.memory.kept_bytes()
        steps, rows, replica_cpu, host_cpu, busy = (a - b for a, b in zip(self._counters(), before, strict=True))
        return ServeRow(
            self.batching,
            workflows,
            len(agent_traces),
            generated,
            wall,
            generated / wall,
            percentile(ttfts, 0.5),
            percentile(ttfts, 0.99),
            growth,
            kv,
            decisions,
            int(steps),
            rows / steps if steps else 0.0,
            system,
            replica_cpu,
            host_cpu,
            busy,
            len(self.replicas),
        )

    # ---- shared root ---------------------------------------------------------------------
    def shared_root(self, agents: int, root_tokens: int, reuse: bool) -> MemoryRow:
        """``agents`` agents over one context, all on the holder; ``reuse=False``: dense."""
        ex = self.client.executor
        self.client.clear_kv()
        graph = agents_graph(agents)
        root = self.contexts.context(root_tokens)
        pin = {ROOT: HOLDER, **{n.id: HOLDER for n in graph.nodes}}
        if reuse:
            ex.materialize_root(f"upstream-{new_run_id()}", root, HOLDER)
        self.memory.start([HOLDER])
        begin = time.perf_counter()
        ex.run(graph, root, new_run_id(), reuse=reuse, pin=pin)
        wall = time.perf_counter() - begin
        return MemoryRow(self.batching, reuse, agents, root_tokens, self.memory.growth(), wall)

    # ---- head-of-line blocking -----------------------------------------------------------
    def head_of_line(self, prefill_tokens: int, short_tokens: int = 128, samples: int = 5) -> HolRow:
        """A short node's TTFT idle and during a long prefill on the same replica."""
        ex = self.client.executor
        short = agents_graph(1)
        pin = {"agent-0": HOLDER}

        def short_ttft() -> float:
            got = ex.run(short, self.contexts.context(short_tokens), new_run_id(), reuse=False, pin=pin)
            return _agent(got).first_token_s

        short_ttft()  # warm-up
        idle = tuple(short_ttft() for _ in range(samples))
        loaded: list[float] = []
        pauses = self._engine_pauses()
        for _ in range(4 * samples):  # NOTE: a prefill that ends before a short node does gives no sample
            if len(loaded) >= samples:
                break
            long_done = threading.Event()
            ctx = self.contexts.context(prefill_tokens)

            def long_run(ctx: list[int] = ctx, done: threading.Event = long_done) -> None:
                try:
                    ex.run(short, ctx, new_run_id(), reuse=False, pin=pin)
                finally:
                    done.set()

            worker = threading.Thread(target=long_run)
            worker.start()
            while not long_done.is_set() and len(loaded) < samples:
                ttft = short_ttft()
                if not long_done.is_set():  # it overlapped the long prefill up to its first token
                    loaded.append(ttft)
            worker.join()
        return HolRow(self.batching, prefill_tokens, idle, tuple(loaded), self._engine_pauses() - pauses)

    def prompt_tokens(self, agents: int) -> tuple[int, ...]:
        """Each agent prompt's length in the served model's tokens."""
        return tuple(len(self.contexts.encode(_agent_prompt(i))) for i in range(agents))

    def _counters(self) -> tuple[float, float, float, float, float]:
        """Engine steps and forward rows the replicas' loops have run so far, the replicas' CPU
        seconds, the host's busy CPU seconds (:mod:`graphflow.bench.host_cpu`) and the wall
        seconds the loops spent in forwards."""
        stats = self.client.status()
        steps, rows = sum(s.engine_steps for s in stats), sum(s.engine_rows for s in stats)
        busy = sum(s.engine_busy_s for s in stats)
        return steps, rows, sum(s.cpu_s for s in stats), host_busy_seconds(), busy

    def _engine_pauses(self) -> int:
        return sum(s.engine_pauses for s in self.client.status())


def decision_counts(traces: Sequence[NodeTrace]) -> dict[str, int]:
    """How many nodes took each decision (``reuse``, ``transfer``, …)."""
    return dict(Counter(t.decision for t in traces))


def _agent(result: RunResult) -> NodeTrace:
    return next(t for t in result.nodes if t.node != ROOT)


def scripted_tokens_per_s(model: str, root_tokens: int, workflows: int, suffix: int, decode: int) -> float:
    """The scripted two-process agents job (``graphflow.bench.agents``, system ``ours``: batched
    decode, roots moved over UCX; not the served path) on the same workload, for comparison."""
    from graphflow.bench.agents import AgentsPlan
    from graphflow.harness.launch import run_two_processes

    plan = AgentsPlan(model, root_tokens, [(workflows, 2)], suffix, decode, ("ours",), 1)
    job = [*plan.args(), "--timeout", "1800"]
    holder, _ = run_two_processes("ucx", job, timeout_s=3600)
    trial = holder["trials"][0]
    return float(trial["generated_tokens"]) / float(trial["makespan_s"])


def run_serve_bench(
    model: str,
    replicas: int,
    workflows: Sequence[int],
    root_tokens: int,
    agents: int,
    decode: int,
    modes: Sequence[bool],
    threads: int = 0,
    max_batch_tokens: int = MAX_BATCH_TOKENS,
    memory_agents: int = 0,
    memory_root: int = 0,
    hol_prefill: int = 0,
    scripted: bool = False,
    say: Callable[[str], None] = lambda _m: None,
    baselines: Sequence[str] = (),
    row_memory: bool = True,
) -> ServeReport:
    """Every measurement for each mode (batching on / off) on a fresh embedded deployment, the
    ``baselines`` (systems of :mod:`graphflow.bench.systems`) on the batched one at every
    workflow count, and with ``scripted`` the scripted agents job at the largest count. With
    ``row_memory`` each throughput row's peak growth comes from a trial of its own run after all the
    timed ones; without it the rows' ``peak_rss_bytes`` is 0 (the shared-root rows, memory
    trials by nature, run either way)."""
    unknown = [b for b in baselines if b not in SYSTEMS or b == "ours"]
    if unknown:
        raise ValueError(f"unknown baseline {unknown[0]!r}; use any of {', '.join(SYSTEMS[1:])}")
    if replicas < 1:
        raise ValueError(f"need at least one replica, got {replicas}")
    if not workflows or min(workflows) < 1 or min(root_tokens, agents, decode) < 1:
        raise ValueError("workflows, --root-tokens, --agents and --decode must all be at least 1")
    if memory_agents < 0 or hol_prefill < 0 or (memory_agents and memory_root < 1):
        raise ValueError("--memory-agents and --hol-prefill must be non-negative, --memory-root positive")
    rows: list[ServeRow] = []
    memory: list[MemoryRow] = []
    hol: list[HolRow] = []
    calibrations: list[dict[str, Any]] = []
    for batching in modes:
        label = "batching" if batching else "no batching"
        say(f"starting {replicas} replicas of {model} ({label})")
        client = connect(
            model=model,
            replicas=replicas,
            decode_steps=decode,
            threads=threads,
            batching=batching,
            max_batch_tokens=max_batch_tokens,
            capacity_mib=2048,
        )
        bench = ServeBench(client, batching, say)
        calibrations.append(calibration_summary(batching, client.executor.policy, client.executor.links))
        # NOTE: a warm-up at full size and the largest count: every replica has run a node and the
        # other replica has received as many roots at once as a timed trial sends it, so the timed
        # trials' receives land in recycled buffers (steady state)
        say(f"{label}: warming up")
        bench.throughput(max(workflows), root_tokens, agents)
        timed: list[ServeRow] = []
        for w in workflows:
            for system in ("ours", *(baselines if batching else ())):
                say(f"{label}: {w} concurrent workflows ({system})")
                timed.append(bench.throughput(w, root_tokens, agents, system))
        for row in timed:
            if row_memory:
                say(f"{label}: {row.workflows} concurrent workflows ({row.system}), measuring memory")
                got = bench.throughput(row.workflows, root_tokens, agents, row.system, memory=True)
                row = replace(row, peak_rss_bytes=got.peak_rss_bytes)
            rows.append(row)
        if memory_agents:
            # NOTE: one unmeasured trial first: torch keeps per-shape workspaces (a 16-row decode's)
            # from their first use on, which are not a trial's memory; the dense trial, run after
            # the measured one, finds them too, so both are measured warm
            say(f"{label}: warming up the shared-root trial")
            bench.shared_root(memory_agents, memory_root, True)
            for reuse in (True, False):
                say(f"{label}: {memory_agents} agents over one {memory_root}-token root (reuse {reuse})")
                memory.append(bench.shared_root(memory_agents, memory_root, reuse))
        if hol_prefill:
            say(f"{label}: a short node during a {hol_prefill}-token prefill")
            hol.append(bench.head_of_line(hol_prefill))
    scripted_rate = None
    if scripted:
        say(f"the scripted agents job at {max(workflows)} workflows")
        scripted_rate = scripted_tokens_per_s(model, root_tokens, max(workflows), 64, decode)
    return ServeReport(
        tuple(rows),
        tuple(memory),
        tuple(hol),
        bench.prompt_tokens(agents),
        scripted_rate,
        row_memory,
        tuple(calibrations),
    )
