"""The multi-agent study's figure, from its CSV only:
``python -m experiments.multi_agent.plot [--results DIR]`` reads ``DIR/multi_agent.csv`` (default: this
study's ``results/``) and writes ``DIR/multi_agent.png``. ``run.py`` calls :func:`plot` after a run.
"""

from __future__ import annotations

from pathlib import Path

from experiments.agents_job import plot_by_system
from experiments.common import plot_main

__all__ = ["plot"]

HERE = Path(__file__).parent


def plot(rows: list[dict[str, str]], png: Path) -> None:
    plot_by_system(
        rows,
        "agents",
        "makespan_s",
        png,
        xlabel="agents sharing the root context",
        ylabel="time until every agent's tokens (s)",
        ideal=True,
    )


if __name__ == "__main__":
    plot_main(__doc__, HERE / "results", "multi_agent.csv", "multi_agent.png", plot)
