"""Honest evaluation of workflow generation (parts 1–2 of the workflow-layer issue).

Part 1, leave-one-benchmark-out: for each benchmark X, build the wGraph and train on every
other benchmark, generate for X's tasks, and compare with X's reference structure. Part 2,
recombination: targets are X's non-failed workflow structures whose every edge exists in the
leave-X-out wGraph but whose whole structure is no training workflow — composing seen
steps into an unseen workflow. Each method is reported beside the *upper bound* any
subgraph of that wGraph can reach, with paired-bootstrap 95% intervals over tasks.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from graphflow.workflow.corpus import Workflow, references
from graphflow.workflow.decode import decode, is_valid
from graphflow.workflow.features import Encoder
from graphflow.workflow.generator import GeneratorConfig
from graphflow.workflow.planner import Planner
from graphflow.workflow.tasks import TaskExample
from graphflow.workflow.train import TrainConfig, edge_f1, imitation
from graphflow.workflow.wgraph import TASK, OpKey, WGraph, structure

__all__ = [
    "METHODS",
    "EvalRow",
    "EvalSettings",
    "GeneratorEval",
    "MethodScore",
    "PartSummary",
    "bootstrap_ci",
    "evaluate_generator",
    "upper_bound",
]

Structure = frozenset[tuple[OpKey, OpKey]]
METHODS = ("gnn", "retrieval", "majority", "random", "gnn_no_task_node", "gnn_1_layer", "gnn_no_h_task")
_ABLATIONS = {
    "gnn": GeneratorConfig(),
    "gnn_no_task_node": GeneratorConfig(task_node=False),
    "gnn_1_layer": GeneratorConfig(layers=1),
    "gnn_no_h_task": GeneratorConfig(task_in_mlp=False),
}


@dataclass(frozen=True, slots=True)
class EvalSettings:
    tasks_per_benchmark: int = 40
    train_tasks_per_benchmark: int = 40
    epochs: int = 20
    seed: int = 0
    bootstrap: int = 1000


@dataclass(frozen=True, slots=True)
class EvalRow:
    """One method's workflow for one test task, scored against one target structure."""

    part: str  # loo | recombination
    method: str
    benchmark: str  # the benchmark left out
    task: int
    ms: float  # generating the workflow
    upper_bound: float  # the best edge F1 any subgraph of the fold's wGraph reaches
    edge_f1: float
    node_jaccard: float
    exact_match: float
    validity: float


@dataclass(frozen=True, slots=True)
class MethodScore:
    edge_f1: float  # mean over the part's rows
    edge_f1_ci: tuple[float, float]  # 95% bootstrap interval of that mean
    upper_bound: float
    exact_match: float
    node_jaccard: float
    validity: float
    ms_per_task: float  # median

    @classmethod
    def of(cls, rows: Sequence[EvalRow], s: EvalSettings) -> MethodScore:
        f1 = [r.edge_f1 for r in rows]
        return cls(
            float(np.mean(f1)),
            bootstrap_ci(f1, s.bootstrap, s.seed),
            float(np.mean([r.upper_bound for r in rows])),
            float(np.mean([r.exact_match for r in rows])),
            float(np.mean([r.node_jaccard for r in rows])),
            float(np.mean([r.validity for r in rows])),
            float(np.median([r.ms for r in rows])),
        )


@dataclass(frozen=True, slots=True)
class PartSummary:
    methods: Mapping[str, MethodScore]
    benchmarks: tuple[str, ...]
    tasks: int


@dataclass(frozen=True, slots=True)
class GeneratorEval:
    parts: Mapping[str, PartSummary]  # loo, recombination
    rows: tuple[EvalRow, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            part: {
                "methods": {k: {**asdict(m), "edge_f1_ci": list(m.edge_f1_ci)} for k, m in p.methods.items()},
                "benchmarks": list(p.benchmarks),
                "tasks": p.tasks,
            }
            for part, p in self.parts.items()
        }

    def csv_rows(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.rows]


def bootstrap_ci(values: Sequence[float], n: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean, resampling tasks."""
    if not values:
        return (float("nan"), float("nan"))
    v = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(n, len(v)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def upper_bound(g: WGraph, target: Structure) -> float:
    """Best edge F1 any subgraph of ``g`` can reach against ``target``."""
    have = {(g.ops[s], g.ops[d]) for s, d in g.edges} | {(TASK, g.ops[i]) for i in g.sources()}
    return edge_f1(frozenset(target & have), target)


def _nodes(s: Structure) -> set[OpKey]:
    return {k for e in s for k in e if k != TASK}


def _metrics(pred: Workflow, pred_s: Structure, target: Structure) -> tuple[float, float, float, float]:
    """Edge F1, node Jaccard, exact match and validity of ``pred`` against ``target``."""
    a, b = _nodes(pred_s), _nodes(target)
    jaccard = len(a & b) / len(a | b) if a | b else 1.0
    return edge_f1(pred_s, target), jaccard, float(pred_s == target), float(is_valid(pred))


def sample_tasks(tasks: list[TaskExample], k: int, seed: int) -> list[TaskExample]:
    by: dict[str, list[TaskExample]] = {}
    for t in tasks:
        by.setdefault(t.benchmark, []).append(t)
    rng = random.Random(seed)
    out = []
    for b in sorted(by):
        out += rng.sample(by[b], min(k, len(by[b])))
    return out


def retrieval_and_majority(
    train: Sequence[tuple[str, Workflow]], enc: Encoder
) -> tuple[Callable[[str], Workflow], Workflow]:
    """The retrieval baseline (workflow of the nearest training task) and the most common
    training workflow."""
    train_x = enc.encode([t for t, _ in train])

    def retrieval(task: str) -> Workflow:
        return train[int(torch.argmax(train_x @ enc.encode([task])[0]))][1]

    counts: dict[str, int] = {}
    for _, w in train:
        counts[w.name] = counts.get(w.name, 0) + 1
    majority = next(w for _, w in train if w.name == max(counts, key=lambda n: counts[n]))
    return retrieval, majority


def _fold_methods(
    g: WGraph, train: list[tuple[str, Workflow]], s: EvalSettings
) -> dict[str, Callable[[str], Workflow]]:
    """Each method as task text → workflow, trained on this fold."""
    methods: dict[str, Callable[[str], Workflow]] = {}
    for name, cfg in _ABLATIONS.items():
        planner = Planner(g, config=cfg, seed=s.seed)
        imitation(planner, train, TrainConfig(epochs=s.epochs, seed=s.seed))
        methods[name] = planner.generate
    retrieval, majority_wf = retrieval_and_majority(train, Planner(g).encoder)
    planner = Planner(g)
    rng = random.Random(s.seed)

    def random_dag(_task: str) -> Workflow:
        scores = torch.rand(len(planner.cands), generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
        nodes, edges, _ = decode(planner.cands, scores)
        return g.to_workflow(nodes, edges)

    methods["retrieval"] = retrieval
    methods["majority"] = lambda _t: majority_wf
    methods["random"] = random_dag
    return methods


def evaluate_generator(
    tasks: list[TaskExample],
    corpus: list[Workflow],
    settings: EvalSettings | None = None,
    say: Callable[[str], None] = lambda _m: None,
) -> GeneratorEval:
    """Run parts 1 and 2: the per-task rows and their summary per part and method."""
    s = settings or EvalSettings()
    refs = references(corpus)
    tasks = [t for t in tasks if t.benchmark in refs]
    if not tasks:
        raise ValueError("no tasks of a benchmark that has a reference workflow")
    rows: list[EvalRow] = []
    for x in sorted({t.benchmark for t in tasks}):
        say(f"leave out {x}")
        train_wfs = [w for w in corpus if w.benchmark != x]
        g = WGraph.build(train_wfs)
        train = [
            (t.text, refs[t.benchmark])
            for t in sample_tasks([t for t in tasks if t.benchmark != x], s.train_tasks_per_benchmark, s.seed)
        ]
        test = sample_tasks([t for t in tasks if t.benchmark == x], s.tasks_per_benchmark, s.seed)
        seen = {structure(w) for w in train_wfs if not w.failed}
        have = {(g.ops[a], g.ops[b]) for a, b in g.edges} | {(TASK, g.ops[i]) for i in g.sources()}
        targets = [("loo", structure(refs[x]))]
        recomb = {structure(w) for w in corpus if w.benchmark == x and not w.failed}
        targets += [("recombination", t) for t in sorted(recomb, key=sorted) if t <= have and t not in seen]
        methods = _fold_methods(g, train, s)
        for name, fn in methods.items():
            for task in test:
                start = time.perf_counter()
                pred = fn(task.text)
                ms = (time.perf_counter() - start) * 1e3
                pred_s = structure(pred)
                for part, target in targets:
                    rows.append(
                        EvalRow(part, name, x, task.index, ms, upper_bound(g, target), *_metrics(pred, pred_s, target))
                    )
    return GeneratorEval(_summarize(rows, s), tuple(rows))


def _summarize(rows: list[EvalRow], s: EvalSettings) -> dict[str, PartSummary]:
    out = {}
    for part in ("loo", "recombination"):
        part_rows = [r for r in rows if r.part == part]
        methods = {}
        for name in METHODS:
            rs = [r for r in part_rows if r.method == name]
            if rs:
                methods[name] = MethodScore.of(rs, s)
        benchmarks = tuple(sorted({r.benchmark for r in part_rows}))
        out[part] = PartSummary(methods, benchmarks, len({(r.benchmark, r.task) for r in part_rows}))
    return out
