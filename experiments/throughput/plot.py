"""The throughput study's figure, from its CSV only:
``python -m experiments.throughput.plot [--results DIR]`` reads ``DIR/throughput.csv`` (default: this
study's ``results/``) and writes ``DIR/throughput.png``. ``run.py`` calls :func:`plot` after a run.
"""

from __future__ import annotations

from pathlib import Path

from experiments.agents_job import plot_by_system
from experiments.common import plot_main

__all__ = ["plot"]

HERE = Path(__file__).parent


def plot(rows: list[dict[str, str]], png: Path) -> None:
    plot_by_system(
        rows, "roots", "tokens_per_s", png, xlabel="concurrent workflows", ylabel="generated tokens per second"
    )


if __name__ == "__main__":
    plot_main(__doc__, HERE / "results", "throughput.csv", "throughput.png", plot)
