"""Residual sparsity: does GraphFlow's ">75% of K, >70% of V residual entries near zero" hold?

``python -m experiments.residual_sparsity.run --model smollm2-135m [--templates short|detailed] [--quick] [--json]``

For real task texts (GSM8K, MBPP from shared/data) as the prefix P and wGraph operation
templates as v: base(v) with no prefix, exact KV of v after P, residual with and without
RoPE re-rotation; per layer, the fraction of K and V entries with |Δ| ≤ ε·mean|K| (resp. |V|)
for ε in {0.01, 0.05, 0.1, 0.5}. Writes ``results/rows.csv`` (one row per task × op × ε ×
rerotated × layer), ``meta.json``, ``results/sparsity.png`` and the README table; with
``--templates detailed`` (250–800-token templates) the same under ``results/detailed/`` and the
README's second table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.common import add_provenance, guard_tree, output_dir, read_csv, replace_section, write_csv, write_meta
from experiments.residual_sparsity.plot import by_eps, plot
from graphflow.kv.differential.base import base_kv, residual, template_kv
from graphflow.kv.differential.codecs import near_zero_fractions
from graphflow.models.engine import Engine
from graphflow.workflow.tasks import load_tasks
from graphflow.workflow.templates import TEMPLATE_SETS, template_for

HERE = Path(__file__).parent
EPS = (0.01, 0.05, 0.1, 0.5)
OPS = ("SOLVE", "REVIEW", "ENSEMBLE", "CODE", "TEST", "REFINE")


def measure(model: str, n_tasks: int, templates: str = "short") -> list[dict[str, object]]:
    engine = Engine.load(model)
    tasks = [t for t in load_tasks() if t.benchmark in ("GSM8K", "MBPP")]
    picked = [t for b in ("GSM8K", "MBPP") for t in [x for x in tasks if x.benchmark == b][: n_tasks // 2]]
    rows: list[dict[str, object]] = []
    rope = engine.identity.rope
    for task in picked:
        prefix = engine.tokenizer.encode(task.text)[:512]
        for op in OPS:
            tmpl = engine.tokenizer.encode(template_for(op, templates))
            base, exact = base_kv(engine, tmpl), template_kv(engine, tmpl, prefix)
            for rerotated in (True, False):
                delta = residual(exact, base, len(prefix), rope if rerotated else None)
                for eps in EPS:
                    k, v = near_zero_fractions(delta, exact, eps)
                    for layer, (kf, vf) in enumerate(zip(k, v, strict=True)):
                        rows.append(
                            {
                                "benchmark": task.benchmark,
                                "task": task.index,
                                "op": op,
                                "eps_rel": eps,
                                "rerotated": rerotated,
                                "layer": layer,
                                "k_near_zero": kf,
                                "v_near_zero": vf,
                                "prefix_tokens": len(prefix),
                                "template_tokens": len(tmpl),
                            }
                        )
    return rows


def summarize(path: Path) -> list[dict[str, object]]:
    return by_eps(read_csv(path))


def table(summary: list[dict[str, object]], path: Path) -> str:
    rows = read_csv(path)
    n = len({(r["benchmark"], r["task"], r["op"]) for r in rows})
    lengths = [int(r["template_tokens"]) for r in rows]
    lines = [
        f"{n} (task, operation) pairs, templates of {min(lengths)}–{max(lengths)} tokens, all layers averaged.\n",
        "| ε (× mean abs) | re-rotated | K near zero | V near zero |",
        "|---|---|---|---|",
    ]
    for s in summary:
        rot = "yes" if s["rerotated"] else "no"
        lines.append(f"| {s['eps_rel']} | {rot} | {s['k_near_zero']:.3f} | {s['v_near_zero']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tasks", type=int, default=10)
    p.add_argument("--templates", default="short", choices=sorted(TEMPLATE_SETS), help="operation templates")
    p.add_argument("--quick", action="store_true", help="2 tasks (≤ 60 s); writes out/quick/, not results/")
    p.add_argument("--json", action="store_true")
    add_provenance(p)
    args = p.parse_args()
    guard_tree(args.allow_dirty, args.quick)
    n = 2 if args.quick else args.tasks
    rows = measure(args.model, n, args.templates)
    sub = "" if args.templates == "short" else args.templates
    results = output_dir(HERE, args.quick, sub)
    results.mkdir(parents=True, exist_ok=True)
    csv_path = results / "rows.csv"
    write_csv(csv_path, rows)
    summary = summarize(csv_path)
    plot(read_csv(csv_path), results / "sparsity.png")
    if not args.quick:
        meta = {"model": args.model, "tasks": n, "eps": list(EPS), "ops": list(OPS), "templates": args.templates}
        write_meta(results if sub else HERE, **meta)
        replace_section(HERE / "README.md", f"table-{sub}" if sub else "table", table(summary, csv_path))
    if args.json:
        print(json.dumps({"model": args.model, "templates": args.templates, "rows": summary}))


if __name__ == "__main__":
    main()
