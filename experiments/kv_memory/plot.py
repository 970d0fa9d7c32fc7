"""The KV-memory study's figure, from its CSV only: ``python -m experiments.kv_memory.plot
[--results DIR]`` reads ``DIR/executions.csv`` (default: this study's ``results/``) and writes
``DIR/fidelity.png``: over the test executions, each method's mean teacher-forced agreement
against the fraction of template tokens it recomputed, one curve per method family.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from experiments.common import plot_main, save_figure

__all__ = ["family_curves", "plot"]

HERE = Path(__file__).parent


def family_curves(rows: list[dict[str, str]]) -> dict[str, list[tuple[float, float, str]]]:
    """Per family, ``(mean recompute fraction, mean agreement, method)`` per method, by fraction."""
    by: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        if r["set"] == "test":
            by[(r["family"], r["method"])].append(r)
    curves: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for (fam, method), sel in by.items():
        frac = statistics.fmean(float(r["recompute_fraction"]) for r in sel)
        curves[fam].append((frac, statistics.fmean(float(r["agreement"]) for r in sel), method))
    return {fam: sorted(points) for fam, points in sorted(curves.items())}


def plot(rows: list[dict[str, str]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for fam, points in family_curves(rows).items():
        ax.plot([f for f, _, _ in points], [a for _, a, _ in points], "o-" if len(points) > 1 else "s", label=fam)
    ax.axhline(0.98, color="red", lw=0.5, label="target 0.98")
    ax.axvline(0.15, color="red", lw=0.5, ls=":")
    ax.set_xlabel("fraction of template tokens recomputed")
    ax.set_ylabel("teacher-forced next-token agreement (test set)")
    ax.legend(fontsize=7)
    save_figure(fig, png)


if __name__ == "__main__":
    plot_main(__doc__, HERE / "results", "executions.csv", "fidelity.png", plot)
