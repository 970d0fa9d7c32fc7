"""The wGraph: one global operation DAG merged from every known workflow.

A node is an *atomic operation* keyed by (operator, functional role, depth), where depth is
the node's longest-path depth in the workflow it came from. Keying by depth is what keeps the
merge acyclic (one round has ScEnsemble→Programmer, another Programmer→ScEnsemble; by
depth they are different nodes), and every edge goes from a smaller to a larger depth, so the
merged graph is a DAG by construction (asserted anyway). Every training workflow is an exact
subgraph of the wGraph it was merged into.

A workflow's *structure* is its set of edges over wGraph nodes plus one edge from the
virtual task node ``TASK`` to each of its sources, so single-node workflows compare too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from graphflow.workflow.corpus import Workflow, WorkflowNode

__all__ = ["TASK", "OpKey", "WGraph", "structure"]

OpKey = tuple[str, str, int]  # (operator, functional role, depth)
TASK: OpKey = ("TASK", "TASK", -1)
WGRAPH_VERSION = 1


def _keys(w: Workflow) -> dict[str, OpKey]:
    depth = w.depths()
    return {n.id: (n.operator, n.role, depth[n.id]) for n in w.nodes}


def structure(w: Workflow) -> frozenset[tuple[OpKey, OpKey]]:
    """Edges of ``w`` over op keys, plus TASK → each source."""
    keys = _keys(w)
    has_in = {d for _, d in w.edges}
    edges = {(keys[s], keys[d]) for s, d in w.edges}
    edges |= {(TASK, keys[n.id]) for n in w.nodes if n.id not in has_in}
    return frozenset(edges)


@dataclass(frozen=True, slots=True)
class WGraph:
    """Operations (index → key) and legal edges (index pairs, src depth < dst depth)."""

    ops: tuple[OpKey, ...]
    edges: tuple[tuple[int, int], ...]
    output_counts: tuple[int, ...]  # how often each op was a workflow output
    source_counts: tuple[int, ...]  # how often each op was a workflow source

    def __post_init__(self) -> None:
        n = len(self.ops)
        for s, d in self.edges:
            if not (0 <= s < n and 0 <= d < n):
                raise ValueError(f"wGraph edge ({s}, {d}) points outside its {n} operations")
            if self.ops[s][2] >= self.ops[d][2]:
                raise ValueError(f"wGraph edge {self.ops[s]} → {self.ops[d]} does not go deeper: not a DAG")

    @classmethod
    def build(cls, workflows: Iterable[Workflow]) -> WGraph:
        """Merge workflows (failed rounds are skipped: they are negative examples)."""
        ops: dict[OpKey, int] = {}
        edges: set[tuple[int, int]] = set()
        outs: dict[int, int] = {}
        srcs: dict[int, int] = {}
        for w in workflows:
            if w.failed:
                continue
            keys = _keys(w)
            for k in sorted(keys.values(), key=lambda k: (k[2], k[0], k[1])):
                ops.setdefault(k, len(ops))
            edges |= {(ops[keys[s]], ops[keys[d]]) for s, d in w.edges}
            for o in w.outputs:
                outs[ops[keys[o]]] = outs.get(ops[keys[o]], 0) + 1
            has_in = {d for _, d in w.edges}
            for n in w.nodes:
                if n.id not in has_in:
                    srcs[ops[keys[n.id]]] = srcs.get(ops[keys[n.id]], 0) + 1
        if not ops:
            raise ValueError("no usable workflows to build a wGraph from")
        order = sorted(ops, key=lambda k: (k[2], k[0], k[1]))
        remap = {ops[k]: i for i, k in enumerate(order)}
        return cls(
            ops=tuple(order),
            edges=tuple(sorted((remap[s], remap[d]) for s, d in edges)),
            output_counts=tuple(outs.get(ops[k], 0) for k in order),
            source_counts=tuple(srcs.get(ops[k], 0) for k in order),
        )

    def index(self, key: OpKey) -> int:
        try:
            return self.ops.index(key)
        except ValueError:
            raise ValueError(f"operation {key} is not in the wGraph") from None

    def contains(self, w: Workflow) -> bool:
        """True when ``w`` is an exact subgraph (all its ops and edges are here)."""
        have = {(self.ops[s], self.ops[d]) for s, d in self.edges}
        return all(e[1] in self.ops and (e[0] == TASK or (e[0] in self.ops and e in have)) for e in structure(w))

    def sources(self) -> list[int]:
        """Ops that can start a workflow (depth 0)."""
        return [i for i, k in enumerate(self.ops) if k[2] == 0]

    def to_workflow(self, nodes: Sequence[int], edges: Sequence[tuple[int, int]], name: str = "generated") -> Workflow:
        """A workflow from chosen op indices and wGraph edges (outputs = its sinks)."""
        ids = {i: f"n{j + 1}" for j, i in enumerate(nodes)}
        has_out = {s for s, _ in edges}
        wf_nodes = tuple(WorkflowNode(ids[i], self.ops[i][0], self.ops[i][1]) for i in nodes)
        return Workflow(
            name=name,
            benchmark="generated",
            nodes=wf_nodes,
            edges=tuple((ids[s], ids[d]) for s, d in edges),
            outputs=tuple(ids[i] for i in nodes if i not in has_out),
        )

    def workflow_structure(
        self, nodes: Sequence[int], edges: Sequence[tuple[int, int]]
    ) -> frozenset[tuple[OpKey, OpKey]]:
        has_in = {d for _, d in edges}
        out = {(self.ops[s], self.ops[d]) for s, d in edges}
        out |= {(TASK, self.ops[i]) for i in nodes if i not in has_in}
        return frozenset(out)

    # ---- persistence ---------------------------------------------------------------------
    def write_parquet(self, path: str | Path) -> None:
        ops = pa.table(
            {
                "operator": [k[0] for k in self.ops],
                "role": [k[1] for k in self.ops],
                "depth": pa.array([k[2] for k in self.ops], pa.int32()),
                "output_count": pa.array(self.output_counts, pa.int32()),
                "source_count": pa.array(self.source_counts, pa.int32()),
                "out_edges": pa.array(
                    [[d for s, d in self.edges if s == i] for i in range(len(self.ops))], pa.list_(pa.int32())
                ),
            }
        ).replace_schema_metadata({"graphflow.wgraph_version": str(WGRAPH_VERSION)})
        pq.write_table(ops, str(path))

    @classmethod
    def read_parquet(cls, path: str | Path) -> WGraph:
        table = pq.read_table(str(path))
        version = (table.schema.metadata or {}).get(b"graphflow.wgraph_version", b"?").decode()
        if version != str(WGRAPH_VERSION):
            raise ValueError(f"{path} is wGraph version {version}; this GraphFlow reads {WGRAPH_VERSION}: rebuild it")
        rows = table.to_pylist()
        return cls(
            ops=tuple((r["operator"], r["role"], r["depth"]) for r in rows),
            edges=tuple((i, d) for i, r in enumerate(rows) for d in r["out_edges"]),
            output_counts=tuple(r["output_count"] for r in rows),
            source_counts=tuple(r["source_count"] for r in rows),
        )

    def __repr__(self) -> str:
        return f"WGraph({len(self.ops)} operations, {len(self.edges)} edges)"
