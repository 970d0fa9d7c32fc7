"""Transfer vs recompute between the served replicas of a three-node deployment.

``python -m experiments.transfer_vs_recompute.deployment [--contexts 256,1024,4096] [--repeats 2] [--json]``

Brings up a three-node namespace cluster (``graphflow cluster up``; needs root) with links
0–1 at 10 Gbit/s, 0–2 at 1 Gbit/s and 1–2 at 100 Mbit/s, serves SmolLM2-135M with one
replica per node (``graphflow serve --spread``; the serve measures the per-pair links and the
prefill / resume costs the policy uses), runs ``graphflow sweep transfer-vs-recompute
--address`` between every ordered pair (``graphflow.bench.sweep_served``), and tears it all
down. Writes ``results/deployment/`` (``sweep.csv``, ``sweep.png``, ``summary.json``,
``meta.json``) and the README's deployment table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from experiments.common import add_provenance, guard_tree, read_csv, replace_section, write_meta
from graphflow.bench.sweep_run import run_deployment_sweep
from graphflow.harness.cluster import ClusterSpec, cluster_down, cluster_up, parse_links
from graphflow.runtime.cluster import shutdown

HERE = Path(__file__).parent
LINKS = "0-1=10gbit,0-2=1gbit,1-2=100mbit"
MODEL = "smollm2-135m"


def _graphflow(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "graphflow.cli", *args, "--json"], capture_output=True, text=True, timeout=1800
    )
    if proc.returncode != 0:
        raise SystemExit(f"graphflow {' '.join(args)} failed: {proc.stderr.strip()[-600:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def table(rows: list[dict[str, str]], summary: dict[str, Any]) -> str:
    head = (
        f"{len(rows)} points, decision accuracy {summary['decision_accuracy']:.2f}, median relative error "
        f"{summary['median_rel_error']:.2f}, regret {summary['regret']:.3f}\n"
    )
    lines = [
        head,
        "| pair (configured link) | measured Gbit/s | context | recompute s | transfer s "
        "| predicted recompute s | predicted transfer s | policy | oracle |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['link']} ({r['configured']}) | {float(r['link_gbps_fitted']):.2f} | {r['context']} "
            f"| {float(r['measured_recompute_s']):.3f} | {float(r['measured_transfer_s']):.3f} "
            f"| {float(r['predicted_recompute_s']):.3f} | {float(r['predicted_transfer_s']):.3f} "
            f"| {r['decision']} | {r['oracle']} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", default="256,1024,4096")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    add_provenance(p)
    args = p.parse_args()
    guard_tree(args.allow_dirty)
    contexts = [int(c) for c in args.contexts.split(",")]
    out = HERE / "results" / "deployment"
    default, pairs = parse_links(LINKS)
    spec = ClusterSpec(3, default, pairs)
    cluster = cluster_up(spec, say=lambda m: print(m, file=sys.stderr))
    try:
        _graphflow(
            "serve",
            "--address",
            cluster.client_address,
            "--model",
            MODEL,
            "--replicas",
            "3",
            "--spread",
            "--capacity-mib",
            "1024",
            "--detach",
        )
        result = run_deployment_sweep(
            cluster.client_address, MODEL, contexts, "", out, args.repeats, say=lambda m: print(m, file=sys.stderr)
        )
        _graphflow("shutdown", "--address", cluster.client_address, "--no-stop-head")
    finally:
        shutdown()  # this process's Ray client, before its cluster goes
        cluster_down()
    rows = read_csv(out / "sweep.csv")
    for r in rows:  # what the pair was configured as, beside what serve measured
        a, b = (int(x.rsplit("-", 1)[-1]) for x in (r["src"], r["dst"]))
        r["configured"] = spec.rate(a, b)
    summary = {k: getattr(result, k) for k in ("points", "decision_accuracy", "median_rel_error", "regret")}
    (out / "summary.json").write_text(json.dumps({**summary, "links_gbps": dict(result.links_gbps)}, indent=2))
    write_meta(out, model=MODEL, contexts=contexts, repeats=args.repeats, links=LINKS, nodes=3, replicas=3)
    replace_section(HERE / "README.md", "deployment", table(rows, summary))
    print(json.dumps(summary) if args.json else table(rows, summary))


if __name__ == "__main__":
    main()
