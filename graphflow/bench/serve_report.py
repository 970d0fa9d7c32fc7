"""What ``graphflow bench serve`` reports: its rows, and the ratios its targets are judged by,
each taken within one run (:mod:`graphflow.bench.serve` measures them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from graphflow.bench.systems import PREFIX_CACHING, lowest_per_key
from scheduler.cost import LinkMatrix
from scheduler.policy import Policy

__all__ = ["HolRow", "MemoryRow", "ServeReport", "ServeRow", "calibration_line", "calibration_summary", "percentile"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    lo = int(at)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


@dataclass(frozen=True, slots=True)
class ServeRow:
    batching: bool
    workflows: int
    agents: int
    generated_tokens: int
    wall_s: float
    tokens_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    peak_rss_bytes: int  # the replicas' peak growth, in a trial of its own (0: not measured)
    kv_bytes: int
    decisions: dict[str, int]
    engine_steps: int  # the replicas' engine-loop steps over the timed part (0: batching off)
    rows_per_step: float  # forward rows per engine step, on average (how much the loop batched)
    system: str = "ours"  # or a baseline of graphflow.bench.systems
    replica_cpu_s: float = 0.0  # CPU seconds the replicas' processes used over the timed part
    host_cpu_s: float = 0.0  # busy CPU seconds of the whole host over it (replicas, client, Ray, OS)
    engine_busy_s: float = 0.0  # wall seconds the replicas' engine loops spent in forwards over it, summed
    replicas: int = 1  # the deployment's replicas

    @property
    def engine_share(self) -> float:
        """The part of the replicas' time (replicas × wall) their engine loops spent in forwards:
        the rest went to receiving, storing, Ray calls and waiting (0 with batching off)."""
        replicas_s = self.wall_s * self.replicas
        return self.engine_busy_s / replicas_s if replicas_s > 0 else 0.0

    @property
    def replica_cores(self) -> float:
        """Cores the replicas kept busy on average over the trial."""
        return self.replica_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def other_cores(self) -> float:
        """Cores everything but the replicas kept busy (the client, Ray, the OS)."""
        return max(0.0, self.host_cpu_s - self.replica_cpu_s) / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class MemoryRow:
    batching: bool
    reuse: bool
    agents: int
    root_tokens: int
    peak_rss_bytes: int  # growth of the holder's resident memory over the run
    wall_s: float


@dataclass(frozen=True, slots=True)
class HolRow:
    batching: bool
    prefill_tokens: int
    idle_ttft_s: tuple[float, ...]
    loaded_ttft_s: tuple[float, ...]
    pauses: int = 0  # engine steps paused for a short prefill while the loaded samples ran

    @property
    def idle_p99_s(self) -> float:
        return percentile(self.idle_ttft_s, 0.99)

    @property
    def loaded_p99_s(self) -> float:
        return percentile(self.loaded_ttft_s, 0.99)

    @property
    def ratio_p99(self) -> float:
        return self.loaded_p99_s / max(self.idle_p99_s, 1e-9)


@dataclass(frozen=True, slots=True)
class ServeReport:
    """The bench's rows, and the ratios its targets are judged by (same run)."""

    rows: tuple[ServeRow, ...]
    memory: tuple[MemoryRow, ...] = ()
    head_of_line: tuple[HolRow, ...] = ()
    agent_prompt_tokens: tuple[int, ...] = ()
    scripted_tokens_per_s: float | None = None  # the scripted agents job, same workload, same run
    row_memory: bool = True  # whether the rows' peak_rss_bytes were measured
    # per deployment (batching on, off): what its calibration measured, which the placements weigh
    calibrations: tuple[dict[str, Any], ...] = ()

    @property
    def speedup_vs_unbatched(self) -> dict[int, float]:
        on = {r.workflows: r for r in self.rows if r.batching and r.system == "ours"}
        off = {r.workflows: r for r in self.rows if not r.batching and r.system == "ours"}
        return {w: on[w].tokens_per_s / off[w].tokens_per_s for w in on if w in off}

    def ours_over(self, system: str) -> dict[int, float]:
        """Batched tokens/s, ours ÷ ``system``, per workflow count (same run)."""
        theirs = {r.workflows: r for r in self.rows if r.batching and r.system == system}
        return {w: r.tokens_per_s / theirs[w].tokens_per_s for w in sorted(theirs) if (r := self.batched(w))}

    @property
    def ours_over_prefix_caching(self) -> dict[int, float]:
        """Ours ÷ the best prefix-caching baseline that ran at each count (most tokens/s)."""
        return lowest_per_key([self.ours_over(s) for s in PREFIX_CACHING])

    @property
    def memory_growth_vs_dense(self) -> dict[str, float]:
        """Per batching mode: the holder's peak growth with the shared root over dense's."""
        dense = {m.batching: m for m in self.memory if not m.reuse}
        ours = {m.batching: m for m in self.memory if m.reuse}
        return {
            ("batching" if b else "no_batching"): ours[b].peak_rss_bytes / max(1, dense[b].peak_rss_bytes)
            for b in ours
            if b in dense
        }

    def batched(self, workflows: int) -> ServeRow | None:
        return next((r for r in self.rows if r.batching and r.system == "ours" and r.workflows == workflows), None)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rows": [
                {
                    **asdict(r),
                    "replica_cores": r.replica_cores,
                    "other_cores": r.other_cores,
                    "engine_share": r.engine_share,
                }
                for r in self.rows
            ],
            "speedup_vs_unbatched": self.speedup_vs_unbatched,
            "ours_over": {s: self.ours_over(s) for s in sorted({r.system for r in self.rows} - {"ours"})},
            "ours_over_prefix_caching": self.ours_over_prefix_caching,
            "agent_prompt_tokens": list(self.agent_prompt_tokens),
            "row_memory": self.row_memory,
        }
        if self.memory:
            out["memory"] = [asdict(m) for m in self.memory]
            out["memory_growth_vs_dense"] = self.memory_growth_vs_dense
        if self.head_of_line:
            out["head_of_line"] = [
                {**asdict(h), "idle_p99_s": h.idle_p99_s, "loaded_p99_s": h.loaded_p99_s, "ratio_p99": h.ratio_p99}
                for h in self.head_of_line
            ]
        if self.scripted_tokens_per_s is not None:
            out["scripted_tokens_per_s"] = self.scripted_tokens_per_s
        if self.calibrations:
            out["calibrations"] = list(self.calibrations)
        return out


def calibration_summary(batching: bool, policy: Policy, links: LinkMatrix) -> dict[str, Any]:
    """What a deployment's calibration measured that its placements weigh: the decode steps and
    contention factor (``None`` without an engine loop) and each measured link."""
    return {
        "batching": batching,
        "decode_steps": asdict(policy.decode) if policy.decode is not None else None,
        "links": links.measured(),
    }


def calibration_line(c: Mapping[str, Any]) -> str:
    """One sentence on a deployment's calibration (:func:`calibration_summary`)."""
    mode = "on" if c["batching"] else "off"
    steps = c["decode_steps"]
    contention = f"replicas stepping at once ×{steps['contention']:.2f}" if steps else "no decode term"
    links = ", ".join(
        f"{ln['src'].rsplit('-', 1)[-1]}→{ln['dst'].rsplit('-', 1)[-1]} {ln['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s"
        for ln in c["links"]
    )
    measured = "measured at the deployment's start"
    return f"Placement weighed, batching {mode}: {contention}; links {links or 'none'} ({measured})."
