"""The same workflow run twice on a deployment, KV reuse on and off: :class:`ReuseComparison`.

``graphflow check e2e`` (:func:`run_e2e_check`) runs a fan-out workflow whose branches are
pinned to the replicas in turn, over a task context long enough that moving its KV beats
recomputing it, and passes when the outputs are identical; ``graphflow demo`` compares each of
its runs the same way (placed by the scheduler alone).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from graphflow.client import Client
from graphflow.runtime.trace import RunResult
from graphflow.workflow.compile import ROOT
from graphflow.workflow.corpus import Workflow
from graphflow.workflow.shapes import fan_out_workflow

__all__ = ["E2ECheckResult", "ReuseComparison", "compare_reuse", "run_e2e_check"]

E2E_TASK = (
    "A warehouse ships 120 boxes on Monday and 3 times as many on Tuesday. Each box holds 8 items. "
    "How many items were shipped in the two days together? "
)


@dataclass(frozen=True, slots=True)
class ReuseComparison:
    workflow: str  # what ran: a generated workflow, or a fixed shape
    nodes: int
    replicas_used: tuple[str, ...]  # the replicas the nodes ran on, reuse on
    wall_s_reuse: float
    wall_s_no_reuse: float
    ttft_s_median_reuse: float
    ttft_s_median_no_reuse: float
    root_prefill_tokens: int  # reuse on: the shared context's one prefill, charged to reuse
    prefill_tokens_reuse: int  # every token prefilled with reuse on, the root's included
    prefill_tokens_no_reuse: int
    prefill_tokens_saved: int  # net of the root's prefill
    bytes_moved: int
    outputs_identical: bool
    decisions: Mapping[str, str]  # node → what the executor did with reuse on

    @classmethod
    def of(cls, workflow: str, on: RunResult, off: RunResult) -> ReuseComparison:
        return cls(
            workflow,
            len(on.nodes),
            tuple(sorted({t.replica for t in on.nodes})),
            on.wall_s,
            off.wall_s,
            statistics.median(t.ttft_s for t in on.nodes),
            statistics.median(t.ttft_s for t in off.nodes),
            on.root_prefill_tokens,
            on.prefill_tokens,
            off.prefill_tokens,
            on.prefill_tokens_saved,
            on.bytes_moved,
            on.outputs == off.outputs,
            {t.node: t.decision for t in on.trace},
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["replicas_used"], out["decisions"] = list(self.replicas_used), dict(self.decisions)
        return out


def compare_reuse(
    client: Client, task: str, workflow: Workflow | None, label: str, pin: Mapping[str, str] | None = None
) -> tuple[ReuseComparison, RunResult]:
    """Run ``task`` with reuse on, then off (both with ``pin``); the comparison and the reuse-on
    run (its trace)."""
    on = client.run(task, workflow, pin=pin)
    off = client.run(task, workflow, reuse=False, pin=pin)
    return ReuseComparison.of(label, on, off), on


@dataclass(frozen=True, slots=True)
class E2ECheckResult:
    comparison: ReuseComparison
    transport: str  # how the replicas moved KV
    replicas: int
    branches: int
    link_gbps_min: float  # the slowest replica pair, as measured at connect time

    @property
    def passed(self) -> bool:
        return self.comparison.outputs_identical

    def to_json(self) -> dict[str, Any]:
        c = self.comparison.to_json()
        return {
            **{k: c[k] for k in ("outputs_identical", "bytes_moved", "root_prefill_tokens", "prefill_tokens_saved")},
            "prefill_tokens_reuse": c["prefill_tokens_reuse"],
            "prefill_tokens_no_reuse": c["prefill_tokens_no_reuse"],
            "transport": self.transport,
            "replicas": self.replicas,
            "branches": self.branches,
            "replicas_used": c["replicas_used"],
            "decisions": c["decisions"],
            "link_gbps_min": self.link_gbps_min,
        }


def run_e2e_check(client: Client, branches: int, context_repeats: int) -> tuple[E2ECheckResult, RunResult]:
    """A ``branches``-way fan-out over a task context of ``context_repeats`` repeats of a short
    problem, reuse on vs off; the result and the reuse-on run."""
    if branches < 1 or context_repeats < 1:
        raise ValueError(f"--branches and --context-repeats must be at least 1, got {branches} and {context_repeats}")
    # NOTE: pinned, because the scheduler alone keeps short branches on the replica holding the
    # context (their own prefills cost less than moving it): the check is of KV that moves
    workflow, replicas = fan_out_workflow(branches), client.cluster.replicas
    pin = {ROOT: replicas[0], **{n.id: replicas[i % len(replicas)] for i, n in enumerate(workflow.nodes[:branches])}}
    comparison, on = compare_reuse(client, E2E_TASK * context_repeats, workflow, "fan-out", pin)
    transports = sorted({s.transport for s in client.status()})
    result = E2ECheckResult(
        comparison, ",".join(transports), len(client.cluster.replicas), branches, client.executor.links.slowest.gbps
    )
    return result, on
