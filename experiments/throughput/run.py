"""Generated tokens per second with 1, 4 and 16 concurrent workflows on two replicas.

``python -m experiments.throughput.run [--model smollm2-135m] [--root-tokens 1024]
[--workflows 1,4,16] [--quick] [--json] [--report]``

Each workflow has its own root context, computed upstream on replica A, and two downstream
agents (one per replica under round robin) that each produce ``--decode`` tokens. All
workflows arrive together; throughput = every agent's generated tokens ÷ the time until the
last one is done (``graphflow/bench/agents.py`` has the systems). Writes ``results/trials.csv``,
``results/throughput.csv``, ``meta.json``, ``results/throughput.png`` and the README table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.agents_job import SYSTEM_LABELS, Study, by_system, study_main
from experiments.throughput.plot import plot

HERE = Path(__file__).parent
PUBLISHED = "AAFLOW+ reports ~9.5× the throughput of its baselines (published, modeled in their code)"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    groups = by_system(rows, "roots")

    def ratio(n: int, other: str) -> float:
        return float(groups[n]["ours"]["tokens_per_s"]) / float(groups[n][other]["tokens_per_s"])

    return {
        "tokens_per_s_ours": {n: float(g["ours"]["tokens_per_s"]) for n, g in sorted(groups.items())},
        "ours_over_dense": {n: ratio(n, "dense") for n in sorted(groups)},
        "ours_over_text": {n: ratio(n, "text") for n in sorted(groups)},
        "ours_over_best_local": {n: min(ratio(n, "local"), ratio(n, "local_holder")) for n in sorted(groups)},
    }


def table(rows: list[dict[str, str]], meta: dict[str, Any]) -> str:
    systems = [s for s in SYSTEM_LABELS if any(r["system"] == s for r in rows)]
    head = " | ".join(f"{SYSTEM_LABELS[s]} tok/s" for s in systems)
    lines = [
        f"| workflows | agents | {head} | scripted ÷ dense | scripted ÷ text | scripted ÷ best local |",
        "|---" * (len(systems) + 5) + "|",
    ]
    for n, sys in sorted(by_system(rows, "roots").items()):
        ours = float(sys["ours"]["tokens_per_s"])
        best_local = max(float(sys[s]["tokens_per_s"]) for s in ("local", "local_holder"))
        cells = " | ".join(f"{float(sys[s]['tokens_per_s']):.1f}" for s in systems)
        lines.append(
            f"| {n} | {sys['ours']['agents']} | {cells} | {ours / float(sys['dense']['tokens_per_s']):.2f} "
            f"| {ours / float(sys['text']['tokens_per_s']):.2f} | {ours / best_local:.2f} |"
        )
    lines.append(f"\nModel {meta.get('model')}, {meta.get('threads')} thread per replica. {PUBLISHED}.")
    return "\n".join(lines)


STUDY = Study(
    folder=HERE,
    name="throughput",
    counts="workflows",
    counts_default="1,4,16",
    root_default=1024,
    quick=(256, "1,4", 32, 8),
    workloads=lambda ns: [(n, 2) for n in ns],
    summarize=lambda rows, _trials: summarize(rows),
    table=table,
    plot=plot,
)

if __name__ == "__main__":
    study_main(STUDY, __doc__)
