"""The peak-memory study's figure, from its CSV only:
``python -m experiments.peak_memory.plot [--results DIR]`` reads ``DIR/peak_memory.csv`` (default: this
study's ``results/``) and writes ``DIR/peak_memory.png``. ``run.py`` calls :func:`plot` after a run.
"""

from __future__ import annotations

from pathlib import Path

from experiments.agents_job import SYSTEM_LABELS
from experiments.common import plot_main, save_figure

__all__ = ["plot"]

HERE = Path(__file__).parent
MIB = 1 << 20


def plot(rows: list[dict[str, str]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in (
        (axes[0], "stored_bytes", "KV kept (BlockStore bytes)"),
        (axes[1], "rss_growth_bytes", "process RSS growth"),
    ):
        for s in SYSTEM_LABELS:
            sel = sorted((int(r["agents"]), int(r[key]) / MIB) for r in rows if r["system"] == s)
            if sel:
                ax.plot([x for x, _ in sel], [y for _, y in sel], "-o", label=SYSTEM_LABELS[s])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("agents sharing the root context")
        ax.set_ylabel("MiB, both replicas")
        ax.set_title(title)
        ax.legend(fontsize=7)
    save_figure(fig, png)


if __name__ == "__main__":
    plot_main(__doc__, HERE / "results", "peak_memory.csv", "peak_memory.png", plot)
