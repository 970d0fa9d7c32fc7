"""The residual-sparsity study's figure, from its CSV only:
``python -m experiments.residual_sparsity.plot [--results DIR]`` reads ``DIR/rows.csv``
(default: this study's ``results/``) and writes ``DIR/sparsity.png``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.common import plot_main

__all__ = ["by_eps", "plot"]

HERE = Path(__file__).parent


def by_eps(rows: list[dict[str, str]]) -> list[dict[str, object]]:
    """Mean K and V near-zero fractions per (re-rotated, ε), over every row."""
    out = []
    for rerot in ("True", "False"):
        for eps in sorted({float(r["eps_rel"]) for r in rows}):
            sel = [r for r in rows if r["rerotated"] == rerot and float(r["eps_rel"]) == eps]
            out.append(
                {
                    "eps_rel": eps,
                    "rerotated": rerot == "True",
                    "k_near_zero": float(np.mean([float(r["k_near_zero"]) for r in sel])),
                    "v_near_zero": float(np.mean([float(r["v_near_zero"]) for r in sel])),
                }
            )
    return out


def plot(rows: list[dict[str, str]], png: Path) -> None:
    summary = by_eps(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for rerot, style in ((True, "-o"), (False, "--x")):
        pts = [s for s in summary if s["rerotated"] == rerot]
        ax.plot([s["eps_rel"] for s in pts], [s["k_near_zero"] for s in pts], style, label=f"K, rerotated={rerot}")
        ax.plot([s["eps_rel"] for s in pts], [s["v_near_zero"] for s in pts], style, label=f"V, rerotated={rerot}")
    ax.set_xscale("log")
    ax.set_xlabel("ε relative to mean |K| / |V|")
    ax.set_ylabel("fraction of residual entries with |Δ| ≤ ε")
    ax.axhline(0.75, color="grey", lw=0.5)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    plot_main(__doc__, HERE / "results", "rows.csv", "sparsity.png", plot)
