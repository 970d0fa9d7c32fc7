"""Generator evaluation, parts 1–2: ``python -m experiments.generator_eval.run [--quick] [--json]``.

Writes ``results/eval_rows.csv`` (one row per part × method × task), ``results/summary.json``,
``meta.json``, and regenerates the tables in this folder's README from the CSV.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from experiments.common import add_provenance, guard_tree, output_dir, read_csv, replace_section, write_csv, write_meta
from graphflow.workflow.corpus import load_corpus
from graphflow.workflow.evaluate import METHODS, EvalSettings, bootstrap_ci, evaluate_generator
from graphflow.workflow.tasks import load_tasks

HERE = Path(__file__).parent


def _mean(rows: list[dict[str, str]], key: str) -> float:
    return float(np.mean([float(r[key]) for r in rows]))


def table_from_csv(path: Path) -> str:
    rows = read_csv(path)
    out = []
    for part in ("loo", "recombination"):
        rs = [r for r in rows if r["part"] == part]
        benches = sorted({r["benchmark"] for r in rs})
        n_tasks = len({(r["benchmark"], r["task"]) for r in rs})
        out.append(f"\n**{part}** — benchmarks: {', '.join(benches)}; tasks: {n_tasks}\n")
        out.append("| method | edge F1 | 95% CI | upper bound | exact match | node Jaccard | validity | ms/task |")
        out.append("|---|---|---|---|---|---|---|---|")
        for m in METHODS:
            mr = [r for r in rs if r["method"] == m]
            if not mr:
                continue
            f1 = [float(r["edge_f1"]) for r in mr]
            lo, hi = bootstrap_ci(f1)
            ms = float(np.median([float(r["ms"]) for r in mr]))
            out.append(
                f"| {m} | {np.mean(f1):.3f} | [{lo:.3f}, {hi:.3f}] | {_mean(mr, 'upper_bound'):.3f} | "
                f"{_mean(mr, 'exact_match'):.2f} | {_mean(mr, 'node_jaccard'):.2f} | "
                f"{_mean(mr, 'validity'):.2f} | {ms:.2f} |"
            )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="10 tasks per benchmark, 10 epochs (≤ 60 s)")
    p.add_argument("--json", action="store_true")
    add_provenance(p)
    args = p.parse_args()
    guard_tree(args.allow_dirty, args.quick)
    s = EvalSettings(tasks_per_benchmark=10, train_tasks_per_benchmark=20, epochs=10) if args.quick else EvalSettings()
    evaluated = evaluate_generator(load_tasks(), load_corpus(), s)
    summary = evaluated.to_json()
    results = output_dir(HERE, args.quick)
    write_csv(results / "eval_rows.csv", evaluated.csv_rows())
    (results / "summary.json").write_text(json.dumps(summary, indent=2))
    settings = {"tasks_per_benchmark": s.tasks_per_benchmark, "epochs": s.epochs, "quick": args.quick}
    write_meta(results if args.quick else HERE, settings=settings)
    if not args.quick:
        replace_section(HERE / "README.md", "tables", table_from_csv(results / "eval_rows.csv"))
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
