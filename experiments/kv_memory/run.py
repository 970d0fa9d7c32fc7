"""Differential KV against CacheBlend and EPIC, on operation templates of realistic length,
scored on held-apart workflows.

``python -m experiments.kv_memory.run --model smollm2-135m --templates detailed [--train-tasks 24]
[--test-tasks 16] [--quick] [--json]``

1. Two disjoint sets of real GSM8K tasks (``--train-tasks``, then ``--test-tasks``); the trained
   planner generates a workflow for each. Path keys ``(P, v)`` are counted on the *train*
   workflows only, and the hot ones (≥ ``--min-count`` executions) chosen.
2. Train: every train workflow runs exactly with the real model in the executor's prompt layout
   (``execute.py``; each node greedily decodes ``--decode`` tokens that later nodes read). Each
   ``ours`` codec learns a hot path's residual from its first ``--refs`` exact executions; the
   later train executions score the codecs (teacher-forced agreement), and the operating codec
   is the one reaching agreement 0.98 with the smallest recompute fraction (then fewest bytes).
3. Test: every test workflow runs exactly; nothing more is learned. Each execution of a hot path
   is rebuilt by every method of ``graphflow.kv.differential.methods`` — stateless,
   cacheblend-r, epic-k, ours (each codec) and stateful — and scored (``score.py``):
   teacher-forced agreement and mean KL, whether greedy decoding reproduces the node's exact
   output, and the template's time to first token against a full template prefill after the
   same prefix, same node, same run.

Bytes are real tensor sizes: ours holds one base per operation (the model's dtype) and one
residual per hot path; stateful holds every execution's template KV (template tokens × the
model's KV bytes per token, checked against the executed tensors). Writes
``results/executions.csv`` (one row per scored execution × method), ``results/summary.json``,
``results/fidelity.png`` and the README tables.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from experiments.common import (
    add_provenance,
    guard_tree,
    output_dir,
    read_csv,
    replace_section,
    write_csv,
    write_meta,
)
from experiments.kv_memory.execute import Execution, execute_workflow
from experiments.kv_memory.plot import plot
from experiments.kv_memory.score import full_prefill_s, score
from experiments.kv_memory.summary import choose_operating, comparisons, method_rows, tables, targets
from graphflow.kv.differential.base import base_kv
from graphflow.kv.differential.codecs import ResidualCodec
from graphflow.kv.differential.methods import TemplateMethod
from graphflow.kv.differential.methods.cacheblend import CacheBlend
from graphflow.kv.differential.methods.epic import Epic
from graphflow.kv.differential.methods.ours import Ours
from graphflow.kv.differential.methods.stateful import Stateful
from graphflow.kv.differential.methods.stateless import Stateless
from graphflow.kv.differential.paths import PathKey, PathStats
from graphflow.kv.differential.store import DifferentialKV
from graphflow.models.engine import Engine
from graphflow.workflow.compile import ExecGraph, compile_workflow, node_path
from graphflow.workflow.planner import Planner
from graphflow.workflow.tasks import load_tasks
from graphflow.workflow.templates import TEMPLATE_SETS

HERE = Path(__file__).parent
OURS_CODECS = (
    ResidualCodec(),
    ResidualCodec(recompute_fraction=0.05),
    ResidualCodec(recompute_fraction=0.10),
    ResidualCodec(recompute_fraction=0.15),
    ResidualCodec(keep_per_row=16, recompute_fraction=0.15),
)
QUICK_OURS_CODECS = (ResidualCodec(), ResidualCodec(recompute_fraction=0.15))
CONCURRENCY = (10, 20, 50)
QUICK_SCORED = 3  # test executions --quick scores (it still executes the whole test workflow)
TRAIN_TASKS = 24  # the default split: the first 24 GSM8K tasks train, the next ones test


def baselines(bases: DifferentialKV, quick: bool) -> list[TemplateMethod]:
    """Every method but ours; ``bases`` holds only the operations' bases."""
    if quick:
        return [Stateless(bases), CacheBlend(bases, 0.15), Epic(bases, fraction=0.15), Stateful()]
    return [
        Stateless(bases),
        *(CacheBlend(bases, r) for r in (0.05, 0.15, 0.30)),
        *(Epic(bases, tokens=k) for k in (8, 32, 64)),
        *(Epic(bases, fraction=f) for f in (0.05, 0.15)),
        Stateful(),
    ]


def family(method: TemplateMethod) -> str:
    """The curve a method belongs to in the figure."""
    if isinstance(method, Ours):
        return "ours (dense)" if method.store.codec.keep_per_row is None else "ours (sparse)"
    if isinstance(method, Epic):
        return "epic (first k tokens)" if method.tokens is not None else "epic (first fraction)"
    return {CacheBlend: "cacheblend", Stateless: "stateless", Stateful: "stateful"}[type(method)]


def _row(split: str, ex: Execution, method: TemplateMethod, scored: dict[str, Any]) -> dict[str, Any]:
    return {
        "set": split,
        "workflow": ex.workflow,
        "node": ex.node,
        "path": str(ex.key),
        "method": method.label,
        "family": family(method),
        "offset": ex.offset,
        "template_tokens": len(ex.template),
        "full_prefill_s": None,
        **scored,
    }


def plan(planner: Planner, texts: list[str], templates: str) -> list[ExecGraph]:
    return [compile_workflow(planner.generate(t), templates) for t in texts]


def run(args: argparse.Namespace, say: Any = print) -> dict[str, Any]:
    engine = Engine.load(args.model)
    enc_cache: dict[str, list[int]] = {}

    def encode(text: str) -> list[int]:
        if text not in enc_cache:
            enc_cache[text] = engine.tokenizer.encode(text)
        return enc_cache[text]

    gsm = [t.text for t in load_tasks() if t.benchmark == "GSM8K"]
    planned = args.test_tasks if args.quick else max(args.test_tasks, *CONCURRENCY)  # memory: up to 50 test workflows
    if len(gsm) < args.train_tasks + planned:
        raise SystemExit(f"only {len(gsm)} GSM8K tasks; ask for fewer than {len(gsm) - planned} train tasks")
    train_texts, test_texts = gsm[: args.train_tasks], gsm[args.train_tasks : args.train_tasks + planned]
    planner = Planner.load()
    train, test_planned = plan(planner, train_texts, args.templates), plan(planner, test_texts, args.templates)
    test = test_planned[: args.test_tasks]
    stats = PathStats()
    for gs in train:
        stats.observe(PathKey(node_path(gs, n.id), n.role) for n in gs.nodes)
    hot = stats.hot(min_count=args.min_count)
    say(f"{len(train)} train + {len(test)} test workflows; {len(stats.counts)} train path keys, {len(hot)} hot")
    ident = engine.identity
    bases = DifferentialKV(ident.model_key, ident.rope, ResidualCodec(), hot=set())
    codecs = QUICK_OURS_CODECS if args.quick else OURS_CODECS
    stores = {c.label: DifferentialKV(ident.model_key, ident.rope, c, set(hot), args.refs) for c in codecs}
    ours = [Ours(s) for s in stores.values()]
    others = baselines(bases, args.quick)
    bpt = engine.kv_bytes_per_token()
    rows: list[dict[str, Any]] = []
    # every test workflow planned (for memory): workflow, path key, template tokens
    planned_nodes = [
        (w, PathKey(node_path(gs, n.id), n.role), len(encode(n.template)))
        for w, gs in enumerate(test_planned)
        for n in gs.nodes
    ]
    for gs in (*train, *test_planned):  # a base needs no task: one per operation, with no prefix
        for n in gs.nodes:
            if n.role not in bases.bases:
                tmpl = encode(n.template)
                kv = base_kv(engine, tmpl)
                for s in (bases, *stores.values()):
                    s.add_base(n.role, tmpl, kv)
    start = time.perf_counter()

    def check(ex: Execution) -> None:
        if ex.exact.numel() * ex.exact.element_size() != len(ex.template) * bpt:
            raise RuntimeError("a template's exact KV is not template tokens × KV bytes per token")

    for w, (gs, text) in enumerate(zip(train, train_texts, strict=True)):
        for ex in execute_workflow(engine, w, gs, encode(text)[: args.max_task_tokens], encode, args.decode):
            check(ex)
            if ex.key in hot and not any(s.wants(ex.key) for s in stores.values()):
                for m in ours:
                    if (got := score(engine, m, ex, greedy=False)) is not None:
                        rows.append(_row("train", ex, m, got))
            for s in stores.values():
                s.observe(ex.key, ex.exact, ex.offset)
        say(f"train {w + 1}/{len(train)}: {len(gs.nodes)} nodes, {time.perf_counter() - start:.0f} s")
    residual_bytes = {m.label: m.store.nbytes()["residual"] for m in ours}
    operating = choose_operating(rows, residual_bytes)
    say(f"operating point (chosen on the train set): {operating}")
    nodes: list[tuple[int, PathKey, int]] = []  # every test node execution: workflow, key, template tokens
    scored = 0
    for w, (gs, text) in enumerate(zip(test, test_texts[: len(test)], strict=True)):
        for ex in execute_workflow(engine, w, gs, encode(text)[: args.max_task_tokens], encode, args.decode):
            check(ex)
            nodes.append((w, ex.key, len(ex.template)))
            if ex.key not in hot or any(ex.key not in s.residuals for s in stores.values()):
                continue  # a cold path: ours prefills it exactly, and it is not scored
            if args.quick and scored == QUICK_SCORED:
                continue
            scored += 1
            full = full_prefill_s(engine, ex)
            for m in (*others, *ours):
                if (got := score(engine, m, ex)) is not None:
                    rows.append(_row("test", ex, m, {**got, "full_prefill_s": full}))
        say(f"test {w + 1}/{len(test)}: {len(gs.nodes)} nodes, {time.perf_counter() - start:.0f} s")
    return {
        "rows": rows,
        "nodes": nodes,
        "planned_nodes": planned_nodes,
        "hot": hot,
        "operating": operating,
        "store": next(m.store for m in ours if m.label == operating),
        "train_workflows": len(train),
        "test_workflows": len(test),
        "bpt": bpt,
    }


def summarize(r: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    rows = r["rows"]
    test_rows = [x for x in rows if x["set"] == "test"]
    if not test_rows:
        raise SystemExit("no test execution was on a hot path; run more --train-tasks or lower --min-count")
    methods = method_rows(test_rows)
    op = next(m for m in methods if m["method"] == r["operating"])
    scored = {(x["workflow"], x["node"]) for x in test_rows}
    by_workflow: dict[int, list[bool]] = defaultdict(list)
    for x in test_rows:
        if x["method"] == r["operating"]:
            by_workflow[x["workflow"]].append(bool(x["identical_output"]))
    identical_workflows = sum(all(by_workflow.get(w, [])) for w in range(r["test_workflows"]))
    store, bpt = r["store"], r["bpt"]
    conc = []
    planned = 1 + max(w for w, _, _ in r["planned_nodes"])
    for n in CONCURRENCY:
        if n > planned:
            continue
        used = [(key, tokens) for w, key, tokens in r["planned_nodes"] if w < n]
        keys = {key for key, _ in used}
        ours_bytes = sum(store.bases[o].nbytes for o in {key.op for key in keys})
        ours_bytes += sum(res.encoded.nbytes for k, res in store.residuals.items() if k in keys)
        conc.append({"workflows": n, "stateful_bytes": sum(t for _, t in used) * bpt, "ours_bytes": ours_bytes})
    tokens = {key.op: t for _, key, t in r["nodes"]}
    s: dict[str, Any] = {
        "templates": args.templates,
        "train_workflows": r["train_workflows"],
        "test_workflows": r["test_workflows"],
        "planned_test_workflows": planned,
        "min_count": args.min_count,
        "refs": args.refs,
        "decode": args.decode,
        "hot_paths": sorted(str(k) for k in r["hot"]),
        "test_executions": len(r["nodes"]),
        "scored_test_executions": len(scored),
        "hot_coverage": len(scored) / len(r["nodes"]),
        "template_tokens": dict(sorted(tokens.items())),
        "template_tokens_min": min(tokens.values()),
        "template_tokens_max": max(tokens.values()),
        "operating_codec": r["operating"],
        "operating": op,
        "recompute_fraction": op["recompute_fraction"],
        "agreement": op["agreement"],
        "identical_output_rate": op["identical_output_rate"],
        "template_ttft_ratio": op["template_ttft_ratio"],
        "identical_workflow_rate": identical_workflows / r["test_workflows"],
        "methods": methods,
        "train_methods": method_rows([x for x in rows if x["set"] == "train"]),
        "comparisons": comparisons(test_rows, [m["method"] for m in methods]),
        "concurrency": conc,
        "kv_bytes_per_token": bpt,
        "residual_bytes": sum(res.encoded.nbytes for res in store.residuals.values()),
        "base_bytes": sum(b.nbytes for b in store.bases.values()),
    }
    s["targets"] = targets(s)
    return s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--templates", default="detailed", choices=sorted(TEMPLATE_SETS), help="operation templates")
    p.add_argument("--train-tasks", type=int, default=TRAIN_TASKS, help="GSM8K tasks whose workflows choose and learn")
    p.add_argument("--test-tasks", type=int, default=16, help="the next GSM8K tasks, whose workflows are scored")
    p.add_argument("--decode", type=int, default=8, help="tokens each node generates and is scored on")
    p.add_argument("--refs", type=int, default=4, help="exact train executions averaged into a path's residual")
    p.add_argument("--min-count", type=int, default=6, help="train executions that make a path key hot")
    p.add_argument("--max-task-tokens", type=int, default=384)
    p.add_argument(
        "--quick",
        action="store_true",
        help=(
            "2 train + 1 test tasks of at most 128 tokens, 4 tokens decoded, six methods on 3 test executions "
            "(under a minute); writes out/quick/, not results/"
        ),
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    add_provenance(p)
    args = p.parse_args()
    guard_tree(args.allow_dirty, args.quick)
    if args.quick:
        args.train_tasks, args.test_tasks, args.decode, args.refs, args.min_count = 2, 1, 4, 1, 1
        args.max_task_tokens = min(args.max_task_tokens, 128)
    if min(args.train_tasks, args.test_tasks, args.decode, args.refs) < 1 or args.min_count < args.refs:
        raise SystemExit("--train-tasks, --test-tasks, --decode and --refs must be positive, --min-count ≥ --refs")
    say = (lambda _m: None) if args.json else print
    r = run(args, say)
    s = summarize(r, args)
    results = output_dir(HERE, args.quick)
    results.mkdir(parents=True, exist_ok=True)
    write_csv(results / "executions.csv", r["rows"])
    (results / "summary.json").write_text(json.dumps({"model": args.model, **s}, indent=2))
    plot(read_csv(results / "executions.csv"), results / "fidelity.png")
    if not args.quick:
        keys = ("templates", "train_tasks", "test_tasks", "decode", "refs", "min_count", "max_task_tokens")
        write_meta(HERE, model=args.model, **{k: getattr(args, k) for k in keys})
        replace_section(HERE / "README.md", "targets", " ".join(s["targets"]))
        replace_section(HERE / "README.md", "table", tables(s))
    if args.json:
        print(json.dumps({"model": args.model, **s}))
    else:
        print("\n".join(s["targets"]))
        print(tables(s))


if __name__ == "__main__":
    main()
