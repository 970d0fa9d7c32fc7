"""The reward study's tables, from its CSV rows (``experiments.generator_eval.reward``): one
run's methods against its best fixed workflow, and one row per seed; intervals by paired
bootstrap over tasks (``graphflow.workflow.evaluate.bootstrap_ci``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import read_csv
from graphflow.workflow.evaluate import bootstrap_ci

__all__ = ["seeds_table", "success", "table_from_csv"]


def success(rows: Sequence[dict[str, Any]], method: str) -> np.ndarray:
    """Each task's success under ``method``, in task order."""
    return np.array(
        [float(r["success"]) for r in sorted((r for r in rows if r["method"] == method), key=lambda r: int(r["task"]))]
    )


def table_from_csv(path: Path) -> str:
    """The test tasks' table of one run's rows: each method's success, per family, and its
    paired difference against the best fixed workflow."""
    rows = read_csv(path)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    families = sorted({r["family"] for r in rows})
    best = max((m for m in methods if m.startswith("fixed:")), key=lambda m: success(rows, m).mean())
    ref = success(rows, best)
    out = [
        f"\n{len(ref)} test tasks ({', '.join(families)}); paired difference against the best fixed "
        f"workflow on these tasks (`{best.removeprefix('fixed:')}`).\n",
        "| method | success | 95% CI | " + " | ".join(families) + " | − best fixed (95% CI) | workflows used |",
        "|---|---|---|" + "---|" * len(families) + "---|---|",
    ]
    for m in methods:
        s = success(rows, m)
        lo, hi = bootstrap_ci(list(s))
        dlo, dhi = bootstrap_ci(list(s - ref))
        per = [np.mean([float(r["success"]) for r in rows if r["method"] == m and r["family"] == f]) for f in families]
        used = len({r["workflow"] for r in rows if r["method"] == m})
        out.append(
            f"| {m} | {s.mean():.3f} | [{lo:.3f}, {hi:.3f}] | "
            + " | ".join(f"{p:.2f}" for p in per)
            + f" | {s.mean() - ref.mean():+.3f} [{dlo:+.3f}, {dhi:+.3f}] | {used} |"
        )
    return "\n".join(out)


def seeds_table(results: Path) -> str:
    """One row per seed run (``reward_rows.csv`` is seed 0, ``reward_seed<N>_rows.csv`` the
    replications): the generator against that run's best fixed workflow."""
    runs = [(0, results / "reward_rows.csv")] + sorted(
        (int(p.name.removeprefix("reward_seed").removesuffix("_rows.csv")), p)
        for p in results.glob("reward_seed*_rows.csv")
    )
    out = [
        "| seed | methods scored | gnn | arithmetic | capital | retrieval | majority | best fixed "
        "| gnn − best fixed (95% CI) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for seed, path in runs:
        if not path.is_file():
            continue
        rows = read_csv(path)
        methods = {r["method"] for r in rows}
        best = max((m for m in methods if m.startswith("fixed:")), key=lambda m: success(rows, m).mean())
        gnn, ref = success(rows, "gnn"), success(rows, best)
        lo, hi = bootstrap_ci(list(gnn - ref))
        per = [
            np.mean([float(r["success"]) for r in rows if r["method"] == "gnn" and r["family"] == f])
            for f in ("arithmetic", "capital")
        ]
        scored = "all" if "retrieval" in methods else "gnn + single-operation fixed"
        corpus = [f"{success(rows, m).mean():.3f}" if m in methods else "—" for m in ("retrieval", "majority")]
        out.append(
            f"| {seed} | {scored} | {gnn.mean():.3f} | {per[0]:.2f} | {per[1]:.2f} | {' | '.join(corpus)} | "
            f"{ref.mean():.3f} (`{best.removeprefix('fixed:')}`) | "
            f"{gnn.mean() - ref.mean():+.3f} [{lo:+.3f}, {hi:+.3f}] |"
        )
    return "\n".join(out)
