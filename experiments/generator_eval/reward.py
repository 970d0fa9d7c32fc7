"""Generator evaluation, part 3 — measured reward: ``python -m experiments.generator_eval.reward [--quick] [--json]``.

Does a task-conditioned generator pick better workflows than one fixed workflow, when
"better" is measured by running the workflows with a real model and checking the answers?

* **Tasks** (constructed, seeded; not from a benchmark; ``reward_tasks``): arithmetic and
  capital cities, whose answers are checked mechanically. Picked because the served model's
  success depends on the workflow in opposite directions (measured while designing: a
  ``PROGRAM`` step whose code is executed answers arithmetic that SmolLM2-135M gets wrong in
  prose, and it fails on capitals, which the model answers in prose).
* **Execution**: every workflow is compiled (``compile_workflow``) and run node by node with
  SmolLM2-135M (real weights) through the engine, in the runtime's prompt layout
  (``node_context``) with the model's chat turns around the task and each operation's template.
  Each node decodes greedily up to ``--max-new`` tokens or the end-of-turn token. Nodes whose
  contract executes code (``PROGRAM``, ``TEST``) run the code they wrote (or their
  predecessor's) in an isolated subprocess (``graphflow.workflow.code_exec``); its result follows
  the node's text. Greedy decoding is deterministic, so a node's output is cached by its exact
  context tokens (what prefix caching would reuse) — every number is still a real model run.
* **Score** of the final output node's text: ``reward_tasks.score`` (rules in its docstring).
* **Methods** on the test tasks: ``gnn`` (the packaged imitation checkpoint fine-tuned by
  REINFORCE on the training tasks' measured reward, reward = success − 0.02 × nodes; each of
  500 steps samples 8 workflows for each of 4 tasks, baseline = the mean of the same task's
  other 7; every edge decision stays random with probability ≥ 0.1, ``explore``; the
  checkpoint's edge logits are first divided by 4, ``temperature``, which keeps its greedy
  choices but un-saturates its scores, and a zero-initialised skip adds the task's own
  features to ``h_task``, ``task_skip``, trained at 30× the learning rate, ``skip_lr_scale``),
  ``gnn_imitation`` (the checkpoint before REINFORCE), ``retrieval`` (the reference workflow of
  the nearest corpus task, as in parts 1–2), ``majority`` (most common reference), and every
  fixed workflow of a pool (each source operation alone, and each benchmark's reference).
  ``best_fixed`` is the pool member with the highest success *on the test tasks* (an oracle
  choice, so the comparison favours the baseline). 95% intervals: paired bootstrap over tasks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.common import replace_section, write_csv, write_meta
from experiments.generator_eval.reward_tables import seeds_table, success, table_from_csv
from experiments.generator_eval.reward_tasks import make_tasks, score
from graphflow.workflow.code_exec import extract_code, run_solve
from graphflow.workflow.compile import ROOT, compile_workflow, node_context
from graphflow.workflow.corpus import Workflow, WorkflowNode, load_corpus, references
from graphflow.workflow.evaluate import bootstrap_ci, retrieval_and_majority, sample_tasks
from graphflow.workflow.planner import Planner
from graphflow.workflow.tasks import load_tasks
from graphflow.workflow.templates import CONTRACTS
from graphflow.workflow.train import reinforce
from graphflow.workflow.wgraph import structure

HERE = Path(__file__).parent
RESULTS = HERE / "results"

CHAT_USER, CHAT_END, CHAT_ASSISTANT = "<|im_start|>user\n", "<|im_end|>\n", "<|im_start|>assistant\n"


class WorkflowRunner:
    """Runs a workflow for a task with the real model; final output text of the workflow."""

    def __init__(self, engine: Any, max_new: int = 32, code_timeout_s: float = 5.0, cache: Path | None = None) -> None:
        self.engine = engine
        self.tok = engine.tokenizer
        self.max_new = max_new
        self.code_timeout_s = code_timeout_s
        self.stop = self.tok.encode(CHAT_END.strip())[0]
        self.cache = cache
        self._memo = self._saved()
        self.node_runs = 0
        self.node_seconds = 0.0

    def _saved(self) -> dict[tuple[Any, ...], tuple[list[int], str]]:
        """Node outputs saved in the cache file by runs of the same model and ``max_new``."""
        if self.cache is None or not self.cache.is_file():
            return {}
        saved = json.loads(self.cache.read_text())
        if saved.get("model_key") != self.engine.identity.model_key or saved.get("max_new") != self.max_new:
            return {}
        return {tuple(k): (ids, text) for k, ids, text in saved["nodes"]}

    def _encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text))

    def run(self, wf: Workflow, task: str) -> str:
        gs = compile_workflow(wf)
        task_ids = self._encode(CHAT_USER + task)
        contexts: dict[str, list[int]] = {ROOT: task_ids}
        outputs: dict[str, list[int]] = {}
        texts: dict[str, str] = {}
        for node in gs.nodes:
            framed = dataclasses.replace(node, template=node.template + CHAT_END + CHAT_ASSISTANT)
            ctx = node_context(framed, contexts, outputs, task_ids, self._encode)
            contexts[node.id] = ctx
            code_from = [texts[p] for p in reversed(node.preds)] if CONTRACTS[node.role].executes_code else None
            outputs[node.id], texts[node.id] = self._node(ctx, code_from)
        return texts[gs.outputs[-1]]

    def _node(self, ctx: list[int], code_from: list[str] | None) -> tuple[list[int], str]:
        key = (*ctx, -1 if code_from is None else -2, *(code_from or ()))
        if key not in self._memo:
            start = time.perf_counter()
            pre = self.engine.prefill(ctx)
            first = int(torch.argmax(pre.logits))
            ids = [first]
            if first != self.stop and self.max_new > 1:
                ids += self.engine.decode_greedy(pre.cache, first, self.max_new - 1, stop_token=self.stop).token_ids
            ids = [t for t in ids if t != self.stop]
            text = self.tok.decode(ids)
            if code_from is not None:
                code = extract_code(text) or next((c for c in map(extract_code, code_from) if c), None)
                text += run_solve(code, self.code_timeout_s).as_text()
                ids = self._encode(text)
            self._memo[key] = ([*ids, *self._encode(CHAT_END + CHAT_USER)], text)
            self.node_runs += 1
            self.node_seconds += time.perf_counter() - start
        return self._memo[key]

    def save(self) -> None:
        """Keep the node outputs (exact context → greedy output) for a later run of this study,
        together with those another run (another seed) saved to the same file meanwhile."""
        if self.cache is not None:
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            memo = {**self._saved(), **self._memo}
            nodes = [[list(k), ids, text] for k, (ids, text) in memo.items()]
            blob = {"model_key": self.engine.identity.model_key, "max_new": self.max_new, "nodes": nodes}
            partial = self.cache.with_suffix(".partial")
            partial.write_text(json.dumps(blob))
            partial.replace(self.cache)  # atomic: a run reading the file never sees half of it


def signature(wf: Workflow) -> str:
    """A workflow's structure as text (roles and depths; stable across names)."""
    edges = sorted(f"{a[1]}@{a[2]}>{b[1]}@{b[2]}" for a, b in structure(wf))
    return ";".join(edges) if edges else "+".join(sorted(n.role for n in wf.nodes))


def single_op(operator: str, role: str) -> Workflow:
    return Workflow(f"only-{role}", "fixed", (WorkflowNode("n0", operator, role),), (), ("n0",))


@dataclass(frozen=True, slots=True)
class Settings:
    train_per_family: int = 20
    test_per_family: int = 20
    steps: int = 500
    samples: int = 8
    tasks_per_step: int = 4
    skip_lr_scale: float = 30.0
    explore: float = 0.1
    temperature: float = 4.0
    task_skip: bool = True
    lr: float = 1e-3
    node_cost: float = 0.02
    max_new: int = 32
    seed: int = 0


def train_generator(
    planner: Planner, tasks: Sequence[str], reward: Callable[[Workflow, str], float], settings: Settings
) -> list[float]:
    """REINFORCE with the study's settings (seeded); the reward of every sampled workflow."""
    torch.manual_seed(settings.seed)
    s = settings
    return reinforce(
        planner,
        tasks,
        reward,
        s.steps,
        s.lr,
        s.seed,
        s.samples,
        s.explore,
        s.temperature,
        s.task_skip,
        s.tasks_per_step,
        s.skip_lr_scale,
    )


def baselines(planner: Planner) -> tuple[Callable[[str], Workflow], Workflow, list[Workflow]]:
    """Corpus retrieval, the majority reference, and the fixed-workflow pool."""
    wfs = load_corpus()
    refs = references(wfs)
    train = [(t.text, refs[t.benchmark]) for t in sample_tasks([t for t in load_tasks() if t.benchmark in refs], 80, 0)]
    retrieval, majority = retrieval_and_majority(train, planner.encoder)
    pool = [single_op(*planner.g.ops[s][:2]) for s in planner.g.sources()] + [refs[b] for b in sorted(refs)]
    return retrieval, majority, pool


def evaluate(
    settings: Settings, say: Callable[[str], None], cache: Path | None = None, lean: bool = False
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Train on the training tasks, score every method on the test tasks. ``lean``: only
    ``gnn`` and the single-operation fixed workflows (the corpus baselines run multi-step
    workflows and take most of an evaluation's model time)."""
    from graphflow.models.engine import Engine

    engine = Engine.load("smollm2-135m")
    runner = WorkflowRunner(engine, max_new=settings.max_new, cache=cache)
    train = make_tasks("train", settings.train_per_family, settings.seed)
    test = make_tasks("test", settings.test_per_family, settings.seed)
    by_text = {t.text: t for t in train}
    planner = Planner.load()
    imitation = Planner.load()
    retrieval, majority, pool = baselines(planner)

    def reward(wf: Workflow, text: str) -> float:
        return score(by_text[text], runner.run(wf, text)) - settings.node_cost * len(wf.nodes)

    start = time.perf_counter()
    say(
        f"REINFORCE: {settings.steps} steps of {settings.tasks_per_step} tasks x {settings.samples} samples "
        f"over {len(train)} training tasks"
    )
    rewards = train_generator(planner, [t.text for t in train], reward, settings)
    train_s = time.perf_counter() - start
    runner.save()
    say(
        f"trained in {train_s:.0f} s ({runner.node_runs} node runs); mean reward first/last 50: "
        f"{np.mean(rewards[:50]):.3f} / {np.mean(rewards[-50:]):.3f}"
    )

    methods: dict[str, Callable[[str], Workflow]] = {
        "gnn": planner.generate,
        "gnn_imitation": imitation.generate,
        "retrieval": retrieval,
        "majority": lambda _t: majority,
    }
    if lean:
        methods = {"gnn": planner.generate}
        pool = [wf for wf in pool if len(wf.nodes) == 1]
    for wf in pool:
        methods[f"fixed:{wf.name}"] = lambda _t, wf=wf: wf
    rows = []
    for name, method in methods.items():
        for i, t in enumerate(test):
            wf = method(t.text)
            text = runner.run(wf, t.text)
            rows.append(
                {
                    "method": name,
                    "task": i,
                    "family": t.family,
                    "workflow": signature(wf),
                    "nodes": len(wf.nodes),
                    "success": score(t, text),
                    "output": text[-120:],
                }
            )
        say(f"{name}: success {np.mean([r['success'] for r in rows if r['method'] == name]):.3f}")
        runner.save()
    return summarize(rows, settings, rewards, train_s, runner), rows


def summarize(
    rows: Sequence[dict[str, Any]], settings: Settings, rewards: Sequence[float], train_s: float, runner: WorkflowRunner
) -> dict[str, Any]:
    fixed = sorted({r["method"] for r in rows if r["method"].startswith("fixed:")})
    best = max(fixed, key=lambda m: success(rows, m).mean())
    gnn = success(rows, "gnn")
    lo, hi = bootstrap_ci(list(gnn - success(rows, best)))
    return {
        "gnn_success": float(gnn.mean()),
        "best_fixed_success": float(success(rows, best).mean()),
        "best_fixed": best.removeprefix("fixed:"),
        **{
            f"{m}_success": float(success(rows, m).mean()) if any(r["method"] == m for r in rows) else None
            for m in ("retrieval", "majority", "gnn_imitation")
        },
        "diff_ci_low": lo,
        "diff_ci_high": hi,
        "tasks": len(gnn),
        "settings": dataclasses.asdict(settings),
        "reinforce_reward_first50": float(np.mean(rewards[:50])),
        "reinforce_reward_last50": float(np.mean(rewards[-50:])),
        "train_seconds": train_s,
        "node_runs": runner.node_runs,
        "node_seconds": runner.node_seconds,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="4 tasks per family, 10 steps of 2 samples (a check)")
    p.add_argument("--steps", type=int, default=None, help="REINFORCE steps (default 500)")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="divide the checkpoint's edge logits by this before REINFORCE (default 4; 1 = unchanged)",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="do not reuse node outputs of earlier runs (results/node_cache.json; same model and --max-new)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="another seed (tasks, sampling, training) as a replication: written to results/reward_seed<N>_*, "
        "the README's main table is left alone (its replications table gains the seed's row)",
    )
    p.add_argument(
        "--lean",
        action="store_true",
        help="with --seed: score only gnn and the single-operation fixed workflows (no corpus baselines; faster)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    s = Settings(train_per_family=4, test_per_family=4, steps=10, samples=2) if args.quick else Settings()
    if args.steps is not None:
        s = dataclasses.replace(s, steps=args.steps)
    if args.temperature is not None:
        s = dataclasses.replace(s, temperature=args.temperature)
    replication = args.seed is not None and args.seed != s.seed
    if args.seed is not None:
        s = dataclasses.replace(s, seed=args.seed)
    cache = None if args.no_cache else RESULTS / "node_cache.json"
    if args.lean and not replication:
        p.error("--lean is for a replication (--seed N other than 0): the README table needs every method")
    summary, rows = evaluate(s, lambda msg: print(msg, flush=True), cache, lean=args.lean)
    out = RESULTS / ("reward_quick" if args.quick else f"reward_seed{s.seed}" if replication else "reward")
    write_csv(Path(f"{out}_rows.csv"), rows)
    Path(f"{out}_summary.json").write_text(json.dumps(summary, indent=2))
    if not args.quick and not replication:
        write_meta(RESULTS / "reward_meta", settings=dataclasses.asdict(s))
        replace_section(HERE / "README.md", "reward", table_from_csv(Path(f"{out}_rows.csv")))
    if not args.quick:
        replace_section(HERE / "README.md", "reward-seeds", seeds_table(RESULTS))
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
