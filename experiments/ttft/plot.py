"""The ttft study's figure, from its CSV only:
``python -m experiments.ttft.plot [--results DIR]`` reads ``DIR/ttft.csv`` (default: this
study's ``results/``) and writes ``DIR/ttft.png``. ``run.py`` calls :func:`plot` after a run.
"""

from __future__ import annotations

from pathlib import Path

from experiments.common import plot_main, save_figure

__all__ = ["plot"]

HERE = Path(__file__).parent


def plot(rows: list[dict[str, str]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, m in zip(axes[0], models, strict=True):
        sel = [r for r in rows if r["model"] == m]
        xs = [int(r["context"]) for r in sel]
        for key, style in (("dense_s", "-o"), ("text_s", "--x"), ("local_s", "-s"), ("ours_s", "-^"), ("bound_s", ":")):
            label = "scripted transfer" if key == "ours_s" else key.removesuffix("_s")
            ax.plot(xs, [float(r[key]) for r in sel], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(m)
        ax.set_xlabel("upstream context tokens")
        ax.set_ylabel("TTFT (s)")
        ax.legend(fontsize=7)
    save_figure(fig, png)


if __name__ == "__main__":
    plot_main(__doc__, HERE / "results", "ttft.csv", "ttft.png", plot)
