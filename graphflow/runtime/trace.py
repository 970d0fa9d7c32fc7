"""What a run reports: one :class:`NodeTrace` per node (and the root's materialization), and
the :class:`RunResult` the executor returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.policy import Decision

__all__ = ["MATERIALIZE", "NodeTrace", "RunResult"]

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
