"""Workflow corpus: AFlow's optimizer rounds (and user YAML) as plain, validated workflows.

Role mapping. AFlow names prompt constants per benchmark (``SOLVE_PROMPT``,
``INITIAL_SOLVE_PROMPT`` …); the same job has many names. We map each (operator, role) to a
*functional* role so the same step is the same node everywhere:

| functional role | operator + AFlow role identifiers |
|---|---|
| SOLVE | Custom with none, SOLVE_PROMPT, SOLVE_STANDARD, INITIAL_SOLVE_PROMPT, |
| | REASONING_PROMPT, STEP_BY_STEP_BOXED_PROMPT, MATH_REASONING_PROMPT |
| SOLVE_ALT | Custom SOLVE_ALTERNATIVE |
| SOLVE_ASSUME | Custom SOLVE_ASSUMPTIONS |
| REVIEW | Custom REVIEW_PROMPT, REVIEW_FINAL, VERIFY_PROMPT |
| REFINE | Custom CORRECTION_PROMPT, FINAL_CORRECTION_PROMPT |
| PATCH | Custom SWE_AGENT_PATCH_PROMPT |
| CODE | CustomCodeGenerate (any role) |
| ENSEMBLE / PROGRAM / TEST / … | ScEnsemble / Programmer / Test / other operators |

Loops. A back-edge (to a node earlier in evaluation order) or self-edge is a loop-carried
dependency: it is dropped from the DAG and the target keeps ``loop_iters``.

Reference rule. A benchmark's reference workflow is its highest-scoring round that did not
fail (``failed_run``); ties go to the earliest round (the simplest structure that reached the
score). Failed rounds are kept as negative examples but never as references.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "FUNCTIONAL_ROLES",
    "Workflow",
    "WorkflowNode",
    "default_corpus_path",
    "functional_role",
    "load_corpus",
    "load_yaml_workflows",
    "references",
    "workflows_yaml",
]

_ROLE_MAP = {
    None: "SOLVE",
    "SOLVE_PROMPT": "SOLVE",
    "SOLVE_STANDARD": "SOLVE",
    "INITIAL_SOLVE_PROMPT": "SOLVE",
    "REASONING_PROMPT": "SOLVE",
    "STEP_BY_STEP_BOXED_PROMPT": "SOLVE",
    "MATH_REASONING_PROMPT": "SOLVE",
    "SOLVE_ALTERNATIVE": "SOLVE_ALT",
    "SOLVE_ASSUMPTIONS": "SOLVE_ASSUME",
    "REVIEW_PROMPT": "REVIEW",
    "REVIEW_FINAL": "REVIEW",
    "VERIFY_PROMPT": "REVIEW",
    "CORRECTION_PROMPT": "REFINE",
    "FINAL_CORRECTION_PROMPT": "REFINE",
    "SWE_AGENT_PATCH_PROMPT": "PATCH",
}
_OPERATOR_ROLE = {
    "CustomCodeGenerate": "CODE",
    "ScEnsemble": "ENSEMBLE",
    "Programmer": "PROGRAM",
    "Test": "TEST",
    "AnswerGenerate": "ANSWER",
    "Format": "FORMAT",
    "Review": "REVIEW",
    "Revise": "REFINE",
    "MdEnsemble": "ENSEMBLE",
}
FUNCTIONAL_ROLES = sorted(set(_ROLE_MAP.values()) | set(_OPERATOR_ROLE.values()))


def functional_role(operator: str, role: str | None) -> str:
    """The functional role of an AFlow (operator, role) pair; unknown Custom roles raise."""
    if operator == "Custom":
        if role not in _ROLE_MAP:
            raise ValueError(f"unknown Custom role {role!r}; add it to the role map in graphflow/workflow/corpus.py")
        return _ROLE_MAP[role]
    if operator not in _OPERATOR_ROLE:
        raise ValueError(f"unknown operation {operator!r}; known: Custom, {', '.join(sorted(_OPERATOR_ROLE))}")
    return _OPERATOR_ROLE[operator]


@dataclass(frozen=True, slots=True)
class WorkflowNode:
    id: str
    operator: str
    role: str  # functional role
    loop_iters: int = 1


@dataclass(frozen=True, slots=True)
class Workflow:
    """A DAG of operation calls. ``edges`` are (src id, dst id) data-flow edges."""

    name: str
    benchmark: str
    nodes: tuple[WorkflowNode, ...]
    edges: tuple[tuple[str, str], ...]
    outputs: tuple[str, ...]
    score: float | None = None
    failed: bool = False
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        ids = [n.id for n in self.nodes]
        if not ids:
            raise ValueError(f"workflow {self.name!r} has no nodes")
        if len(set(ids)) != len(ids):
            raise ValueError(f"workflow {self.name!r} repeats node ids")
        known = set(ids)
        dangling = [e for e in self.edges if e[0] not in known or e[1] not in known]
        if dangling:
            raise ValueError(f"workflow {self.name!r} has edges to unknown nodes: {dangling}")
        if any(o not in known for o in self.outputs):
            raise ValueError(f"workflow {self.name!r} names unknown output nodes {self.outputs}")
        if _has_cycle(ids, self.edges):
            raise ValueError(f"workflow {self.name!r} is cyclic; cut loop back-edges (keep them as loop_iters)")

    def node(self, node_id: str) -> WorkflowNode:
        return next(n for n in self.nodes if n.id == node_id)

    def depths(self) -> dict[str, int]:
        """Longest path (in edges) from any source to each node."""
        depth = {n.id: 0 for n in self.nodes}
        for nid in topo_order([n.id for n in self.nodes], self.edges):
            for src, dst in self.edges:
                if src == nid:
                    depth[dst] = max(depth[dst], depth[src] + 1)
        return depth


def topo_order(ids: list[str], edges: Iterable[tuple[str, str]]) -> list[str]:
    indeg = {i: 0 for i in ids}
    out: dict[str, list[str]] = {i: [] for i in ids}
    for s, d in edges:
        indeg[d] += 1
        out[s].append(d)
    ready = [i for i in ids if indeg[i] == 0]
    order = []
    while ready:
        n = ready.pop(0)
        order.append(n)
        for d in out[n]:
            indeg[d] -= 1
            if indeg[d] == 0:
                ready.append(d)
    return order


def _has_cycle(ids: list[str], edges: Iterable[tuple[str, str]]) -> bool:
    return len(topo_order(ids, list(edges))) != len(ids)


def default_corpus_path() -> Path:
    """``../shared/data/workflows/aflow_workflows.json`` next to the project (or $GRAPHFLOW_DATA)."""
    import os

    root = Path(os.environ.get("GRAPHFLOW_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
    return root / "workflows" / "aflow_workflows.json"


def _from_aflow(raw: dict[str, Any], index: int) -> Workflow:
    order = [n["id"] for n in raw["nodes"]]
    pos = {nid: i for i, nid in enumerate(order)}
    loops = {n["id"]: n.get("loop_iters") for n in raw["nodes"]}
    nodes = []
    for n in raw["nodes"]:
        iters = n.get("loop_iters")
        nodes.append(
            WorkflowNode(
                n["id"],
                n["operator"],
                functional_role(n["operator"], n["role"]),
                iters if isinstance(iters, int) else 1,
            )
        )
    # NOTE: back-edges and self-edges are loop-carried; the DAG keeps forward edges only.
    edges = tuple(dict.fromkeys((s, d) for s, d in raw["edges"] if pos[s] < pos[d]))
    name = f"{raw['benchmark']}-r{raw.get('round')}-{index}"
    return Workflow(
        name=name,
        benchmark=raw["benchmark"],
        nodes=tuple(nodes),
        edges=edges,
        outputs=tuple(raw.get("outputs") or order[-1:]),
        score=raw.get("score"),
        failed=bool(raw.get("failed_run", False)),
        meta={"round": raw.get("round"), "source_repo": raw.get("source_repo"), "loops": loops},
    )


def load_corpus(path: str | Path | None = None) -> list[Workflow]:
    """All workflows of an AFlow-facts JSON file (default: the shared data folder)."""
    path = Path(path) if path else default_corpus_path()
    if not path.is_file():
        raise ValueError(f"workflow corpus {path} not found; pass --corpus or set GRAPHFLOW_DATA")
    data = json.loads(path.read_text())
    return [_from_aflow(w, i) for i, w in enumerate(data["workflows"])]


def load_yaml_workflows(path: str | Path) -> list[Workflow]:
    """User workflows from YAML: a list of ``{name, benchmark, nodes: [{id, operator, role,
    loop_iters}], edges: [[src, dst]], outputs: [...], score, failed}`` (only ``nodes`` and each
    node's ``id`` and ``operator`` required); ``role`` may be a functional or an AFlow role."""
    import yaml

    try:
        items = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a list of workflows at the top level")
    out = []
    for i, w in enumerate(items):
        try:
            nodes = tuple(
                WorkflowNode(
                    str(n["id"]),
                    str(n["operator"]),
                    n["role"] if n.get("role") in FUNCTIONAL_ROLES else functional_role(n["operator"], n.get("role")),
                    int(n.get("loop_iters", 1)),
                )
                for n in w["nodes"]
            )
            out.append(
                Workflow(
                    name=str(w.get("name", f"user-{i}")),
                    benchmark=str(w.get("benchmark", "user")),
                    nodes=nodes,
                    edges=tuple((str(s), str(d)) for s, d in w.get("edges", [])),
                    outputs=tuple(str(o) for o in w.get("outputs", [nodes[-1].id])),
                    score=w.get("score"),
                    failed=bool(w.get("failed", False)),
                )
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(
                f"{path}: workflow {i} is malformed ({exc}); see load_yaml_workflows for the format"
            ) from None
    return out


def workflows_yaml(workflows: Iterable[Workflow]) -> str:
    """``workflows`` in the YAML that :func:`load_yaml_workflows` reads back (roles written as
    functional roles), for a user to keep, edit and submit."""
    import yaml

    items = [
        {
            "name": w.name,
            "benchmark": w.benchmark,
            "nodes": [
                {"id": n.id, "operator": n.operator, "role": n.role, "loop_iters": n.loop_iters} for n in w.nodes
            ],
            "edges": [list(e) for e in w.edges],
            "outputs": list(w.outputs),
            **({"score": w.score} if w.score is not None else {}),
            **({"failed": True} if w.failed else {}),
        }
        for w in workflows
    ]
    return str(yaml.safe_dump(items, sort_keys=False))


def references(workflows: Iterable[Workflow]) -> dict[str, Workflow]:
    """Per benchmark, the reference workflow (see the module doc's reference rule)."""
    best: dict[str, Workflow] = {}
    for w in workflows:
        if w.failed:
            continue
        cur = best.get(w.benchmark)
        score = w.score if w.score is not None else -1.0
        cur_score = (cur.score if cur.score is not None else -1.0) if cur else -2.0
        if score > cur_score:
            best[w.benchmark] = w
    return best
