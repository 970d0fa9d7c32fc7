"""The KV-memory study's figure, from its CSV only: ``python -m experiments.kv_memory.plot
[--results DIR]`` reads ``DIR/executions.csv`` (default: this study's ``results/``) and writes
``DIR/memory.png``: per codec, over hot-path executions, the median residual ÷ dense template
bytes against the mean teacher-forced agreement; the stateless line is base-only agreement.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from experiments.common import plot_main, save_figure

__all__ = ["codec_points", "plot"]

HERE = Path(__file__).parent
_NOT_CODECS = ("exact (stateful)", "stateless")


def codec_points(rows: list[dict[str, str]]) -> list[tuple[str, float, float]]:
    """``(codec, residual ÷ dense bytes, agreement)`` per codec, over the hot executions."""
    out = []
    for codec in sorted({r["codec"] for r in rows} - set(_NOT_CODECS)):
        sel = [r for r in rows if r["codec"] == codec and r["hot"] == "True"]
        if sel:
            sd = statistics.median(float(r["residual_bytes"]) / float(r["dense_template_bytes"]) for r in sel)
            out.append((codec, sd, statistics.fmean(float(r["agreement"]) for r in sel)))
    return out


def plot(rows: list[dict[str, str]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    points = codec_points(rows)
    ax.plot([sd for _, sd, _ in points], [a for _, _, a in points], "o")
    for codec, sd, agreement in points:
        ax.annotate(codec, (sd, agreement), fontsize=7)
    stateless = [float(r["agreement"]) for r in rows if r["codec"] == "stateless" and r["hot"] == "True"]
    if stateless:
        ax.axhline(statistics.fmean(stateless), color="grey", ls="--", lw=0.8, label="stateless (base only)")
    ax.axhline(0.98, color="red", lw=0.5, label="target 0.98")
    ax.axvline(0.2, color="red", lw=0.5)
    ax.set_xlabel("residual bytes ÷ dense template KV bytes (S/D)")
    ax.set_ylabel("teacher-forced next-token agreement")
    ax.legend(fontsize=7)
    save_figure(fig, png)


if __name__ == "__main__":
    plot_main(__doc__, HERE / "results", "executions.csv", "memory.png", plot)
