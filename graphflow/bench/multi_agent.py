"""k agents over one root context, through the served path, beside an ideal measured on its own.

On an embedded deployment (``connect()`` → executor → replica actors → manager → UCX), per k,
one trial per system, each on a fresh root context of ``root_tokens`` tokens (fresh, so no trial
reuses another's blocks) and from empty stores (``Client.clear_kv``: no trial meets an earlier
one's states):

* ``ours`` — the root is prefilled on ``replica-0`` (an upstream agent computing it), then the
  k agents are submitted as one workflow and the scheduler places them: reuse on the holder, or
  a transfer of the root's blocks to the other replica.
* ``ideal`` — the root's prefill is timed in its own trial on ``replica-0``; then the root is
  prefilled on every other replica too (not timed), so each replica already holds it, and the
  same k agents run with nothing to move: ``ideal = root prefill + agents with zero
  transfer``. A trial that moved any byte is refused (it would not be the ideal).
* ``dense``, ``local``, ``routed``, ``holder`` — the same agents run as
  :mod:`graphflow.bench.systems` runs them: KV reuse off; per-replica prefix caching behind a
  round-robin balancer; with cache-aware routing (ours with transfers off); with
  prefix-affinity routing (every agent on the holder). The last three never move KV.

``makespan_s`` = root prefill (ours, ideal) + the time from the agents' submission until the
last agent's last token; ``efficiency`` = ideal ÷ ours. ``peak_rss_growth_bytes`` is the
replicas' peak resident-memory growth over the whole trial, the root's prefill included
(:class:`~graphflow.bench.replica_memory.ReplicaMemory`; the peak-memory study reports it), or
0 when the run leaves memory alone (``memory=False``: timing in steady state, see
:func:`run_multi_agent_bench`).
Every number is measured here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from graphflow.bench.replica_memory import ReplicaMemory
from graphflow.bench.serve import HOLDER, agents_graph, decision_counts
from graphflow.bench.serve_report import calibration_summary
from graphflow.bench.served import PinnedAgent
from graphflow.bench.systems import PREFIX_CACHING, lowest_per_key, run_as
from graphflow.client import Client, connect, new_run_id

__all__ = [
    "MultiAgentBench",
    "MultiAgentReport",
    "MultiAgentRow",
    "check_request",
    "median_trial",
    "run_multi_agent_bench",
]

SYSTEMS = ("ours", "ideal", "dense", *PREFIX_CACHING)


@dataclass(frozen=True, slots=True)
class MultiAgentRow:
    system: str
    agents: int
    root_tokens: int
    root_prefill_s: float  # 0 for dense (each agent prefills the root itself)
    agents_s: float  # the agents' submission to the last agent's last token
    makespan_s: float
    generated_tokens: int
    bytes_moved: int
    decisions: dict[str, int]
    replicas_used: int
    peak_rss_growth_bytes: int = 0  # summed over the replicas, the whole trial
    makespans_s: tuple[float, ...] = ()  # every repeat's makespan, fastest first (this row is their median)


def median_trial(tries: Sequence[MultiAgentRow]) -> MultiAgentRow:
    """The repeats of one (k, system): the trial of median makespan (the slower middle one of an
    even count), carrying every repeat's makespan in ``makespans_s``."""
    if not tries:
        raise ValueError("no trials to take the median of")
    ranked = sorted(tries, key=lambda r: r.makespan_s)
    return replace(ranked[len(ranked) // 2], makespans_s=tuple(r.makespan_s for r in ranked))


class MultiAgentBench:
    """The trials of one deployment (see the module docstring)."""

    def __init__(self, client: Client, say: Callable[[str], None] = lambda _m: None, memory: bool = True) -> None:
        self.client = client
        self.say = say
        self.contexts = PinnedAgent(client)
        self.memory = ReplicaMemory(client) if memory else None

    def trial(self, system: str, agents: int, root_tokens: int) -> MultiAgentRow:
        """One trial of ``system`` (one of ``SYSTEMS``) with ``agents`` agents."""
        if system not in SYSTEMS:
            raise ValueError(f"unknown system {system!r}; use {', '.join(SYSTEMS)}")
        ex = self.client.executor
        self.client.clear_kv()  # every trial starts from empty stores
        root = self.contexts.context(root_tokens)
        if self.memory is not None:
            self.memory.start()
        prefill_s = 0.0
        if system != "dense":
            begin = time.perf_counter()
            ex.materialize_root(f"upstream-{new_run_id()}", root, HOLDER)
            prefill_s = time.perf_counter() - begin
        if system == "ideal":
            for other in self.client.cluster.replicas:
                if other != HOLDER:  # NOTE: not timed: each replica already holds the root
                    ex.materialize_root(f"upstream-{new_run_id()}", root, other)
        graph = agents_graph(agents)
        begin = time.perf_counter()
        got = run_as("ours" if system == "ideal" else system, ex, graph, root, self.client.cluster.replicas, HOLDER)
        agents_s = time.perf_counter() - begin
        growth = self.memory.growth() if self.memory is not None else 0
        traces = got.nodes
        if system == "ideal" and got.bytes_moved:
            raise RuntimeError(f"the ideal trial moved {got.bytes_moved} bytes; it must move none")
        decisions = decision_counts(traces)
        generated = sum(len(out) for out in got.outputs.values())
        return MultiAgentRow(
            system,
            agents,
            root_tokens,
            prefill_s,
            agents_s,
            prefill_s + agents_s,
            generated,
            got.bytes_moved,
            decisions,
            len({t.replica for t in traces}),
            growth,
        )


@dataclass(frozen=True, slots=True)
class MultiAgentReport:
    """The trials kept, and per k the ratios the targets are judged by (same run): ideal ÷ ours
    (efficiency: makespans, the root's prefill included, as the ideal is defined), the same over
    the agents' part alone, and dense ÷ ours."""

    rows: tuple[MultiAgentRow, ...]
    threads: int = 0  # torch threads per replica
    transport: str = ""
    memory_price: float = 0.0  # seconds per GiB of new KV the deployment's placement charged
    calibration: Mapping[str, Any] | None = None  # what the placements weighed (serve_report.calibration_summary)

    def _over_ours(self, system: str, part: Callable[[MultiAgentRow], float]) -> dict[int, float]:
        by = {(r.agents, r.system): r for r in self.rows}
        ks = sorted({r.agents for r in self.rows})
        return {k: part(by[k, system]) / part(by[k, "ours"]) for k in ks if (k, system) in by and (k, "ours") in by}

    @property
    def efficiency(self) -> dict[int, float]:
        return self._over_ours("ideal", lambda r: r.makespan_s)

    @property
    def efficiency_agents_only(self) -> dict[int, float]:
        return self._over_ours("ideal", lambda r: r.agents_s)

    @property
    def dense_over_ours(self) -> dict[int, float]:
        return self._over_ours("dense", lambda r: r.makespan_s)

    @property
    def efficiency_min(self) -> float | None:
        return min(self.efficiency.values(), default=None)

    @property
    def memory_over_dense(self) -> dict[str, dict[int, float]]:
        """Per system but dense, per k: its peak RSS growth ÷ dense's (< 1: less memory)."""
        by = {(r.agents, r.system): r for r in self.rows}
        out: dict[str, dict[int, float]] = {}
        for (k, system), r in sorted(by.items()):
            dense = by.get((k, "dense"))
            if system != "dense" and dense is not None and dense.peak_rss_growth_bytes > 0:
                out.setdefault(system, {})[k] = r.peak_rss_growth_bytes / dense.peak_rss_growth_bytes
        return out

    @property
    def prefix_caching_over_ours(self) -> dict[int, float]:
        """The best prefix-caching baseline that ran at k: its makespan ÷ ours (> 1: ours ahead)."""
        return lowest_per_key([self._over_ours(s, lambda r: r.makespan_s) for s in PREFIX_CACHING])

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> MultiAgentReport:
        """A report back from its :meth:`to_json` (a study's committed JSON); the ratios are
        derived again from the rows."""
        rows = tuple(MultiAgentRow(**{**r, "makespans_s": tuple(r.get("makespans_s", ()))}) for r in obj["rows"])
        price = obj.get("memory_price_s_per_gib", 0.0)
        return cls(rows, obj.get("threads", 0), obj.get("transport", ""), price, obj.get("calibration"))

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": [asdict(r) for r in self.rows],
            "efficiency": self.efficiency,
            "efficiency_agents_only": self.efficiency_agents_only,
            "dense_over_ours": self.dense_over_ours,
            "efficiency_min": self.efficiency_min,
            "prefix_caching_over_ours": self.prefix_caching_over_ours,
            "memory_over_dense": self.memory_over_dense,
            "threads": self.threads,
            "transport": self.transport,
            "memory_price_s_per_gib": self.memory_price,
            "calibration": self.calibration,
        }


def check_request(agents: Sequence[int], root_tokens: int, decode: int, repeats: int, systems: Sequence[str]) -> None:
    """Raise ``ValueError`` (one sentence) for settings :func:`run_multi_agent_bench` cannot run."""
    if not agents or min(agents) < 1 or min(root_tokens, decode, repeats) < 1:
        raise ValueError("--agents, --root-tokens, --decode and --repeats must all be at least 1")
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or "ours" not in systems:
        raise ValueError(f"--systems takes ours plus any of {', '.join(SYSTEMS[1:])}; got {', '.join(systems)}")


def run_multi_agent_bench(
    model: str,
    agents: Sequence[int],
    root_tokens: int,
    decode: int,
    threads: int = 0,
    repeats: int = 1,
    say: Callable[[str], None] = lambda _m: None,
    systems: Sequence[str] = SYSTEMS,
    memory: bool = True,
    memory_price: float = 0.0,
) -> MultiAgentReport:
    """Every system at every k on one fresh two-replica embedded deployment (after a warm-up
    trial of ours at k = 2 and full size); with ``repeats`` > 1 the systems take turns ``repeats`` times per k and
    the trial of median makespan is kept per (k, system) (:func:`median_trial`).

    ``memory=False`` leaves the replicas' memory alone between trials (``peak_rss_growth_bytes``
    is then 0): measuring peak growth hands the memory freed so far back to the OS before each
    trial, the receive buffers a replica recycles included, so every trial's transfer lands in
    fresh pages (a 4K-token SmolLM2 root took ~0.6 s to receive so against ~0.05 s into recycled
    buffers) while the baselines, which never receive, pay nothing for it. Timing runs without it
    measure the replicas as they serve in steady state. ``memory_price``: the deployment's (see
    :func:`graphflow.client.connect`); it prices the placements of every system the scheduler
    places (ours, routed)."""
    check_request(agents, root_tokens, decode, repeats, systems)
    say(f"starting 2 replicas of {model}")
    client = connect(
        model=model, replicas=2, decode_steps=decode, threads=threads, capacity_mib=2048, memory_price=memory_price
    )
    bench = MultiAgentBench(client, say, memory)
    # NOTE: a warm-up at full size: both replicas have run a node and one has received a whole root,
    # so a steady-state run's receives land in recycled buffers (as `graphflow serve`'s prefaulted pool)
    bench.trial("ours", 2, root_tokens)
    rows: list[MultiAgentRow] = []
    for k in agents:
        tries: dict[str, list[MultiAgentRow]] = {system: [] for system in systems}
        for repeat in range(repeats):  # NOTE: the systems take turns, so a slow spell of the host is shared
            for system in systems:
                say(f"{k} agents: {system}" + (f" (repeat {repeat + 1} of {repeats})" if repeats > 1 else ""))
                tries[system].append(bench.trial(system, k, root_tokens))
        rows += [median_trial(tries[system]) for system in systems]
    first = client.status()[0]
    calibration = calibration_summary(first.batching, client.executor.policy, client.executor.links)
    return MultiAgentReport(tuple(rows), first.threads, first.transport, memory_price, calibration)
