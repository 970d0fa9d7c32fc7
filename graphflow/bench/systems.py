"""The systems the served benches run the same workload as, on one deployment.

Each is the served path (``WorkflowExecutor.run``) with some of what ours does turned off:

* ``ours`` — the scheduler places every node: reuse where a replica holds the prefix, a
  transfer of the missing blocks from another replica, or a recompute;
* ``dense`` — KV reuse off: every node prefills its whole context;
* ``local`` — per-replica prefix caching behind a round-robin balancer (what vLLM or SGLang
  replicas give): node j runs on replica j mod N, each replica reuses only prefixes it holds,
  nothing moves between replicas; nodes that arrive together each miss (no in-flight sharing);
* ``routed`` — prefix caching with cache-aware routing: the scheduler places every node (its
  prefix on the holder against the other replicas' queues and a recompute), nothing moves. Its
  queue estimate charges each queued node a prefill of its whole context, so under load it
  sends nodes to recompute on an idle replica;
* ``holder`` — prefix caching with prefix-affinity routing: every node runs on the replica that
  holds the context (what a router that always follows the longest cached prefix does),
  nothing moves.

The context (``ROOT``) is always materialized on ``holder``, where an upstream step left it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from graphflow.client import new_run_id
from graphflow.runtime.executor import WorkflowExecutor
from graphflow.runtime.trace import RunResult
from graphflow.workflow.compile import ROOT, ExecGraph

__all__ = ["PREFIX_CACHING", "SYSTEMS", "lowest_per_key", "run_as"]


@dataclass(frozen=True, slots=True)
class _System:
    reuse: bool
    transfers: bool
    round_robin: bool = False
    on_holder: bool = False


_SYSTEMS = {
    "ours": _System(reuse=True, transfers=True),
    "dense": _System(reuse=False, transfers=True),
    "local": _System(reuse=True, transfers=False, round_robin=True),
    "routed": _System(reuse=True, transfers=False),
    "holder": _System(reuse=True, transfers=False, on_holder=True),
}
SYSTEMS = tuple(_SYSTEMS)
PREFIX_CACHING = ("local", "routed", "holder")  # the baselines serving stacks give


def lowest_per_key(per_system: Sequence[Mapping[int, float]]) -> dict[int, float]:
    """Per key (a k, a workflow count), the lowest ratio among the systems that ran there: with
    ratios of theirs over ours, or ours over theirs, the best baseline's."""
    keys = sorted({k for ratios in per_system for k in ratios})
    return {k: min(r[k] for r in per_system if k in r) for k in keys}


def run_as(
    system: str, executor: WorkflowExecutor, graph: ExecGraph, root: Sequence[int], replicas: Sequence[str], holder: str
) -> RunResult:
    """Run ``graph`` over the context ``root`` as ``system`` would (see the module docstring);
    a prefix-caching run that moved bytes is refused (it would not be that baseline)."""
    if system not in _SYSTEMS:
        raise ValueError(f"unknown system {system!r}; use {', '.join(SYSTEMS)}")
    how = _SYSTEMS[system]
    pin = {ROOT: holder}
    if how.round_robin:
        pin.update({n.id: replicas[j % len(replicas)] for j, n in enumerate(graph.nodes)})
    if how.on_holder:
        pin.update({n.id: holder for n in graph.nodes})
    got = executor.run(graph, list(root), new_run_id(), reuse=how.reuse, pin=pin, transfers=how.transfers)
    if not how.transfers and got.bytes_moved:
        raise RuntimeError(f"the {system} run moved {got.bytes_moved} bytes; it must move none")
    return got
