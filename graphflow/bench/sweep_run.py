"""Driver of ``graphflow sweep transfer-vs-recompute``: run every link, write CSV, PNG, JSON."""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from graphflow.bench.sweep import analyse
from graphflow.bench.sweep_points import SweepPoint, SweepSummary, summarize
from graphflow.harness.launch import run_two_processes
from graphflow.harness.netns import shaped_link

__all__ = ["run_deployment_sweep", "run_sweep", "write_sweep"]


def _job(model: str, contexts: Sequence[int], repeats: int) -> list[str]:
    return [
        "--job",
        "sweep",
        "--model",
        model,
        "--contexts",
        ",".join(map(str, contexts)),
        "--repeats",
        str(repeats),
        "--timeout",
        "1200",
    ]


def run_sweep(
    model: str,
    contexts: Sequence[int],
    backends: Sequence[str],
    links_mbit: Sequence[float],
    out: Path,
    repeats: int = 3,
    say: Callable[[str], None] = lambda _m: None,
) -> SweepSummary:
    """Loopback runs for each backend, then ucx over tcp through each shaped link."""
    rows: list[SweepPoint] = []
    for backend in backends:
        say(f"{model}: {backend} over loopback")
        _, got = run_two_processes(backend, _job(model, contexts, repeats), timeout_s=7200)
        rows += analyse(got, model, f"{backend}-loopback")[0]
    for rate in links_mbit:
        say(f"{model}: ucx over tcp through a {rate:g} Mbit/s shaped link")
        with shaped_link(rate) as link:
            _, got = run_two_processes("ucx", _job(model, contexts, repeats), timeout_s=7200, link=link)
        rows += analyse(got, model, f"tcp-{rate:g}mbit")[0]
    return write_sweep(rows, out)


def run_deployment_sweep(
    address: str,
    model: str,
    contexts: Sequence[int],
    pairs: str,
    out: Path,
    repeats: int = 3,
    say: Callable[[str], None] = lambda _m: None,
) -> SweepSummary:
    """The sweep between the served replicas of the deployment at ``address`` (see
    ``bench.sweep_served``); ``pairs`` as ``replica-0:replica-2,…`` ('' = every ordered pair)."""
    from graphflow.bench.sweep_served import parse_pairs, sweep_deployment
    from graphflow.client import connect

    client = connect(address, decode_steps=1)
    served = client.served_model(model)
    if len(client.cluster.replicas) < 2:
        raise ValueError("a deployment sweep needs at least two replicas; serve more (`graphflow serve --replicas 2`)")
    limit = client.cluster.get(client.cluster.call(client.cluster.replicas[0], "max_positions"))
    if limit and max(contexts) + 128 > limit:
        raise ValueError(f"{served} accepts {limit} positions; keep --contexts at most {limit - 128} tokens")
    rows = sweep_deployment(client, served, contexts, repeats, parse_pairs(pairs, client.cluster.replicas), say)
    links = {r.link: r.link_gbps_fitted for r in rows}
    return replace(write_sweep(rows, out), pairs=tuple(sorted(links)), links_gbps=links)


def write_sweep(rows: list[SweepPoint], out: Path) -> SweepSummary:
    """``sweep.csv``, ``sweep.png`` and the summary (decision accuracy, prediction error, regret)."""
    summary = summarize(rows)
    out.mkdir(parents=True, exist_ok=True)
    plain = [r.csv_row() for r in rows]
    with open(out / "sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(plain[0]))
        writer.writeheader()
        writer.writerows(plain)
    plot_sweep(out / "sweep.csv", out / "sweep.png")
    return replace(summary, csv=str(out / "sweep.csv"), png=str(out / "sweep.png"))


def plot_sweep(csv_path: Path, png_path: Path) -> None:
    """Measured recompute vs transfer+resume per link (reads only the CSV)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    links = sorted({r["link"] for r in rows})
    fig, ax = plt.subplots(figsize=(8, 5))
    for model in sorted({r["model"] for r in rows}):
        rec = sorted(
            {
                (int(r["context"]), float(r["measured_recompute_s"]))
                for r in rows
                if r["model"] == model and r["link"] == links[0]
            }
        )
        ax.plot([c for c, _ in rec], [s for _, s in rec], "k-o", label=f"{model}: recompute (prefill)")
        for link in links:
            pts = sorted(
                (int(r["context"]), float(r["measured_transfer_s"]))
                for r in rows
                if r["model"] == model and r["link"] == link
            )
            ax.plot([c for c, _ in pts], [s for _, s in pts], "--x", label=f"{model}: transfer+resume, {link}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context tokens")
    ax.set_ylabel("seconds (measured, median)")
    ax.set_title("transfer vs recompute")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
