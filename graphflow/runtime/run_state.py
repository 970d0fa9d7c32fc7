"""What one run of the executor tracks between launching its nodes and collecting them.

A :class:`RunState` holds the run's options, the contexts and results so far, the node attempts
in flight (:class:`Flight`: a node call, and for a transfer the source's send), the prefixes
transfers are bringing to each replica, and the nodes to recompute after a failed attempt.
The executor (``runtime.executor``) decides and launches; this class only keeps the books.
A :class:`Deadline` is the run's time limit, where its caller gave one.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from graphflow.runtime.cluster_api import Cluster
from graphflow.runtime.errors import RunTimeout
from graphflow.runtime.plan import NodeResult
from graphflow.runtime.trace import NodeTrace, RunResult
from scheduler.policy import Decision, Option

__all__ = ["Deadline", "Flight", "RunState"]


@dataclass(frozen=True, slots=True)
class Deadline:
    """A run's time limit: ``timeout_s`` from ``start`` (``None``: no limit) over its ``nodes``."""

    timeout_s: float | None
    nodes: int  # 0: before the workflow is known (the task's encoding and plan)
    start: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout must be more than 0 s, got {self.timeout_s}")

    def left(self) -> float | None:
        """Seconds left to wait (0 once past), ``None`` without a limit."""
        return None if self.timeout_s is None else max(0.0, self.start + self.timeout_s - time.monotonic())

    def result(self, cluster: Cluster, handle: Any) -> Any:
        """``handle``'s result once ready; ``RunTimeout`` (no node done yet) if it is not in time."""
        if cluster.wait_one([handle], self.left()) is None:
            raise self.passed(0)
        return cluster.get(handle)

    def passed(self, done: int) -> RunTimeout:
        where = f"{done} of {self.nodes} nodes done" if self.nodes else "its workflow not started"
        return RunTimeout(
            f"the task did not finish within {self.timeout_s:g} s ({where}); give it longer, or see "
            "`graphflow status` for a replica that stopped answering"
        )


@dataclass(frozen=True, slots=True)
class Flight:
    """One node attempt in flight: ``handles`` are its node call, then the source's send (a
    transfer); ``t0`` is when deciding it began, ``decide_s`` what deciding took."""

    node: str
    decision: Decision
    handles: list[Any]
    t0: float
    decide_s: float


@dataclass
class RunState:
    """One run: its options (``reuse``, ``pin``, ``force``, ``transfers``: see
    ``WorkflowExecutor.run``) and its books (see the module docstring)."""

    run_id: str
    task_ids: list[int]
    replicas: Sequence[str]
    reuse: bool = True
    pin: Mapping[str, str] = field(default_factory=dict)
    force: Option | None = None
    transfers: bool = True
    tokens: dict[str, list[int]] = field(default_factory=dict)  # each node's context (ROOT: the task's)
    results: dict[str, NodeResult] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    traces: list[NodeTrace] = field(default_factory=list)
    in_flight: dict[Any, Flight] = field(default_factory=dict)  # by the node call's handle
    sending: dict[Any, tuple[str, int]] = field(default_factory=dict)  # a send's handle → (receiver, transfer id)
    load: dict[str, int] = field(default_factory=dict)  # this run's nodes in flight on each replica
    transferring: dict[str, tuple[int, ...]] = field(default_factory=dict)  # replica → the prefix coming to it
    retry: dict[str, str] = field(default_factory=dict)  # node → why its last attempt failed (recomputed)
    attempts: dict[str, int] = field(default_factory=dict)
    turn: Iterator[int] = field(default_factory=itertools.count)  # round robin with reuse off
    begin: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.load = dict.fromkeys(self.replicas, 0) | self.load

    @property
    def outputs(self) -> dict[str, tuple[int, ...]]:
        return {nid: res.output_ids for nid, res in self.results.items()}

    def launched(self) -> set[str]:
        """Nodes with an attempt in flight."""
        return {f.node for f in self.in_flight.values()}

    def started(self, flight: Flight, ctx: Sequence[int], transfer_id: int) -> None:
        """``flight`` was launched (for a transfer, ``transfer_id`` brings ``ctx``'s prefix)."""
        d = flight.decision
        if d.option is Option.TRANSFER:
            self.transferring[d.replica] = tuple(ctx[: d.source_tokens])
            self.sending[flight.handles[1]] = (d.replica, transfer_id)
        self.in_flight[flight.handles[0]] = flight
        self.load[d.replica] += 1

    def landed(self, handle: Any) -> Flight:
        """The node call ``handle`` finished (or failed): it is no longer in flight."""
        flight = self.in_flight.pop(handle)
        for h in flight.handles[1:]:
            self.sending.pop(h, None)
        d = flight.decision
        self.load[d.replica] -= 1
        if d.option is Option.TRANSFER:
            self.transferring.pop(d.replica, None)
        return flight

    def done(self, flight: Flight, res: NodeResult, trace: NodeTrace) -> None:
        """Record a node's result."""
        self.results[flight.node] = res
        self.retry.pop(flight.node, None)
        self.decisions.append(flight.decision.with_measured(res.total_s))
        self.traces.append(trace)

    def result(self, final: str) -> RunResult:
        return RunResult(
            outputs=self.outputs,
            texts={k: v.text for k, v in self.results.items()},
            final=self.results[final].text,
            trace=tuple(self.traces),
            decisions=tuple(self.decisions),
            wall_s=time.perf_counter() - self.begin,
        )
