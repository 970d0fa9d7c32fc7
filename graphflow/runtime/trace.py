"""What a run reports: one :class:`NodeTrace` per node (and the root's materialization), and
the :class:`RunResult` the executor returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from graphflow.runtime.plan import NodeResult
from scheduler.policy import Decision, Option

__all__ = ["MATERIALIZE", "NodeTrace", "RunResult", "node_trace"]

MATERIALIZE = "materialize"  # the decision of the root's trace row


@dataclass(frozen=True, slots=True)
class NodeTrace:
    node: str
    replica: str
    decision: str  # what ran: reuse / transfer / reconstruct / recompute (or materialize for the root)
    source: str
    predicted_s: float
    measured_s: float
    ttft_s: float
    bytes_moved: int
    prefill_tokens: int
    prefill_tokens_saved: int  # tokens whose KV was reused (own store or received), not prefilled
    context_tokens: int
    output: str
    note: str = ""  # why a fallback happened (a failed transfer, a lost replica), else ""
    rebuilt_tokens: int = 0  # template tokens the replica rebuilt from base + residual (not prefilled)
    planned: str = ""  # the scheduler's choice, when what ran differs from it
    decide_s: float = 0.0  # executor: hashing the context, the manager round trip and placement
    latency_s: float = 0.0  # executor: from deciding to holding the result (Ray calls both ways included)
    phases: tuple[tuple[str, float], ...] = ()  # the replica's (phase, seconds): lookup, receive, rebuild, …

    @property
    def first_token_s(self) -> float:
        """Seconds from the executor deciding this node to its first token, as served: the
        latency less the replica's time after its first token (decode, storing the state).
        The result's return trip stays in, so this bounds the served TTFT from above."""
        return self.latency_s - (self.measured_s - self.ttft_s)


def node_trace(nid: str, d: Decision, res: NodeResult, context: int, decide_s: float, latency_s: float) -> NodeTrace:
    """The trace row of node ``nid``, decided as ``d`` and run as ``res`` says: what ran is
    what the replica did (a transfer that moved nothing, or a rebuild that rebuilt nothing, ran
    as reuse or recompute), with the planned option kept beside it when they differ."""
    ran = d.option
    rebuilt_none = ran is Option.RECONSTRUCT and not res.rebuilt_tokens
    if rebuilt_none or (ran is Option.TRANSFER and not res.transferred_tokens):
        ran = Option.REUSE if res.reused_tokens else Option.RECOMPUTE
    note = "; ".join(x for x in (d.fallback, res.note) if x)
    return NodeTrace(
        nid,
        res.replica,
        ran.value,
        d.source if ran is Option.TRANSFER else "",
        d.chosen_predicted_s,
        res.total_s,
        res.ttft_s,
        res.bytes_moved,
        res.prefill_tokens,
        res.reused_tokens + res.transferred_tokens,
        context,
        res.text,
        note,
        res.rebuilt_tokens,
        d.option.value if ran is not d.option else "",
        decide_s,
        latency_s,
        res.phases,
    )


@dataclass(frozen=True, slots=True)
class RunResult:
    outputs: dict[str, tuple[int, ...]]
    texts: dict[str, str]
    final: str
    trace: tuple[NodeTrace, ...]  # the root's materialization (reuse on) first, then each node
    decisions: tuple[Decision, ...] = field(default=(), compare=False)
    wall_s: float = field(default=0.0, compare=False)

    @property
    def nodes(self) -> tuple[NodeTrace, ...]:
        """The workflow's node rows (without the root's materialization)."""
        return tuple(t for t in self.trace if t.decision != MATERIALIZE)

    @property
    def bytes_moved(self) -> int:
        return sum(t.bytes_moved for t in self.trace)

    @property
    def root_prefill_tokens(self) -> int:
        return sum(t.prefill_tokens for t in self.trace if t.decision == MATERIALIZE)

    @property
    def prefill_tokens(self) -> int:
        """Every token this run prefilled, the root's materialization included."""
        return sum(t.prefill_tokens for t in self.trace)

    @property
    def prefill_tokens_saved(self) -> int:
        """Net tokens not prefilled against running every node from scratch: KV reused or
        rebuilt in the nodes, less the root's own prefill (negative when nothing reused it)."""
        return sum(t.prefill_tokens_saved + t.rebuilt_tokens for t in self.nodes) - self.root_prefill_tokens
