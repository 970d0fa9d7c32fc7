"""Compile a workflow to the stateful execution graph G_s = (V, E_d, E_s).

* V — the workflow's operations plus ``ROOT``, the task context (materialized once).
* E_d — data edges: ``v`` consumes ``u``'s output text.
* E_s — KV-state edges: the state ``v``'s prompt extends. Prompt layout (see templates):

```
single predecessor u:   [ state(u) = task · … · template(u) · output(u) ] [ template(v) ]
                         └──────────── reused exactly (fork of u's state) ┘
otherwise:              [ task ] [ output(p1) ] … [ output(pk) ] [ template(v) ]
                         └ fork of ROOT ┘
```

A chain therefore reuses its whole history exactly; fan-in nodes (an ensemble over several
candidates) fork the shared task context and prefill their inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from graphflow.workflow.corpus import Workflow, topo_order
from graphflow.workflow.templates import template_for

__all__ = ["ROOT", "ExecGraph", "ExecNode", "compile_workflow", "node_context", "node_path"]

ROOT = "ROOT"


@dataclass(frozen=True, slots=True)
class ExecNode:
    id: str
    operator: str
    role: str
    template: str
    preds: tuple[str, ...]
    state_parent: str  # ROOT or the single predecessor whose state this node extends
    loop_iters: int = 1


@dataclass(frozen=True, slots=True)
class ExecGraph:
    nodes: tuple[ExecNode, ...]  # topological order
    data_edges: tuple[tuple[str, str], ...]
    state_edges: tuple[tuple[str, str], ...]
    outputs: tuple[str, ...]

    def node(self, node_id: str) -> ExecNode:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise ValueError(f"no node {node_id!r} in this execution graph")

    def ready(self, done: set[str]) -> list[str]:
        """Nodes not yet done whose predecessors all are (they may run concurrently)."""
        return [n.id for n in self.nodes if n.id not in done and all(p in done for p in n.preds)]


def compile_workflow(w: Workflow, templates: str = "short") -> ExecGraph:
    """G_s of ``w`` with each operation's template from the set ``templates`` (short or detailed)."""
    order = topo_order([n.id for n in w.nodes], w.edges)
    preds = {nid: tuple(s for s, d in w.edges if d == nid) for nid in order}
    nodes = []
    for nid in order:
        n = w.node(nid)
        parent = preds[nid][0] if len(preds[nid]) == 1 else ROOT
        template = template_for(n.role, templates)
        nodes.append(ExecNode(nid, n.operator, n.role, template, preds[nid], parent, n.loop_iters))
    return ExecGraph(
        nodes=tuple(nodes),
        data_edges=tuple(w.edges),
        state_edges=tuple((n.state_parent, n.id) for n in nodes),
        outputs=w.outputs,
    )


def node_context(
    node: ExecNode,
    contexts: Mapping[str, Sequence[int]],
    outputs: Mapping[str, Sequence[int]],
    task_ids: Sequence[int],
    encode: Callable[[str], list[int]],
) -> list[int]:
    """The node's prompt in the layout above: extend the state parent's context and output, or
    task context + each predecessor's output; then the operation's template."""
    tmpl = encode(node.template)
    if node.state_parent != ROOT:
        return [*contexts[node.state_parent], *outputs[node.state_parent], *tmpl]
    ctx = list(task_ids)
    for p in node.preds:
        ctx += [*encode(f"\n[{p}] "), *outputs[p]]
    return ctx + tmpl


def node_path(gs: ExecGraph, node_id: str) -> tuple[str, ...]:
    """The roles whose outputs precede ``node_id``'s template in its prompt, in prompt order
    (the prefix path P of differential KV; empty when only the task precedes it)."""
    node = gs.node(node_id)
    if node.state_parent != ROOT:
        parent = gs.node(node.state_parent)
        return (*node_path(gs, parent.id), parent.role)
    return tuple(gs.node(p).role for p in node.preds)
